//go:build !amd64 || purego

package wire

import "hash/crc32"

// hasVPCLMUL is false: the 256-bit CLMUL CRC is amd64 assembly.
const hasVPCLMUL = false

// crc32Update returns crc32.Update(crc, crc32.IEEETable, p).
func crc32Update(crc uint32, p []byte) uint32 {
	return crc32.Update(crc, crc32.IEEETable, p)
}

// crc32UpdateCopy copies p into dst (at least as long) and returns
// crc32Update(crc, p).
func crc32UpdateCopy(crc uint32, dst, p []byte) uint32 {
	copy(dst, p)
	return crc32.Update(crc, crc32.IEEETable, p)
}
