//go:build !amd64 || purego

package wire

import "hash/crc32"

// hasVPCLMUL is false: the 256-bit CLMUL CRC is amd64 assembly.
const hasVPCLMUL = false

// crc32Update returns crc32.Update(crc, crc32.IEEETable, p).
func crc32Update(crc uint32, p []byte) uint32 {
	return crc32.Update(crc, crc32.IEEETable, p)
}
