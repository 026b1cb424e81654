package microvm

import (
	"slices"
	"time"
)

func rdtsc() uint64

// tscKHz measures the host's TSC frequency. Under TCG the guest's TSC is
// the host's, but the guest cannot calibrate it: the emulated PIT is too
// slow to be a reference, and without one Linux falls back to the jiffies
// clock (10 ms resolution, no vDSO). Passing tsc_early_khz gives the guest
// a precise clock from the first instruction.
func tscKHz() uint64 {
	var samples []uint64
	for range 5 {
		t0, c0 := time.Now(), rdtsc()
		time.Sleep(20 * time.Millisecond)
		t1, c1 := time.Now(), rdtsc()
		if ns := t1.Sub(t0).Nanoseconds(); ns > 0 && c1 > c0 {
			samples = append(samples, (c1-c0)*1_000_000/uint64(ns))
		}
	}
	if len(samples) == 0 {
		return 0
	}
	// The median: a preemption between a clock reading and its TSC
	// reading skews one sample, not the middle one.
	slices.Sort(samples)
	return samples[len(samples)/2]
}
