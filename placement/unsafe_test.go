package placement_test

import "unsafe"

func addr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
