//go:build !amd64

package memcopy

const useAVX512 = false

func copyAVX512(dst, src *byte, n int) { panic("memcopy: no AVX-512 on this architecture") }

const hasAVX512 = false
