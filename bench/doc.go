// Package bench holds softrdma's macro benchmarks: whole RDMA operations
// driven through the public verbs API (package softrdma), named after the
// perftest tools whose scenarios they reproduce (ib_write_bw, ib_read_bw,
// ib_send_bw, ib_write_lat, ib_atomic_bw).
//
// The benchmarks live in the package's _test.go files and run with go test:
//
//	go test -run '^$' -bench . ./bench/                    # every scenario, 1 s each
//	go test -run '^$' -bench . -benchtime 1x ./bench/      # smoke test (CI)
//	go test -run '^$' -bench 'WriteBWTwoProcess/size=65536' -count 5 ./bench/
//
// Besides ns/op, MB/s (10^6 bytes per second, from b.SetBytes) and
// allocations, each benchmark reports custom metrics with b.ReportMetric:
// retransmits/op, datagrams per send and receive syscall, latency
// percentiles, and for BenchmarkWriteBWTwoProcess the ratio of softrdma's
// goodput to a raw UDP pair (GSO + GRO, same batching) measured in the
// same run, and for BenchmarkWriteBWODP (ib_write_bw --odp: first touch
// under each fault policy, steady state) the ratio to a pinned target
// measured on the same devices in the same run, with page faults per op
// and fault latency. docs/performance.md records the numbers and what
// they mean.
//
// Micro-benchmarks (codec, ICRC, STag lookup, translation, placement copy)
// live beside the code they measure.
package bench
