// Package pool is seed 001's KeyedWorkerPool as written there (1024 worker
// goroutines each reading its own channel, FNV-32a of the aggregate ID modulo
// the count picks the channel, ProcessMessage sends with a timed wait), and
// keybus-bench's plan, shared by the in-process yardstick (bench/origin_go)
// and the NATS pipeline (bench/origin_go/nats).
package pool

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"syscall"
	"time"
)

type AggregateMessage struct {
	AggregateID string
	Agg         int
	Seq         uint64
	Payload     []byte
	Ref         any // what the handler needs besides (the NATS pipeline: its message, to ack)
}

type KeyedWorkerPool struct {
	workers     []chan *AggregateMessage
	waitTimeout time.Duration
}

var ErrWorkerQueueFull = errors.New("worker queue full")

func NewKeyedWorkerPool(workers, queue int, wait time.Duration, handle func(*AggregateMessage)) *KeyedWorkerPool {
	kp := &KeyedWorkerPool{workers: make([]chan *AggregateMessage, workers), waitTimeout: wait}
	for i := range kp.workers {
		ch := make(chan *AggregateMessage, queue)
		kp.workers[i] = ch
		go func() {
			for m := range ch {
				handle(m)
			}
		}()
	}
	return kp
}

func (kp *KeyedWorkerPool) hashToIndex(key string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	return int(h.Sum32() % uint32(len(kp.workers)))
}

func (kp *KeyedWorkerPool) ProcessMessage(ctx context.Context, msg *AggregateMessage) error {
	if msg.AggregateID == "" {
		return errors.New("aggregateID required for keyed worker pool")
	}
	ch := kp.workers[kp.hashToIndex(msg.AggregateID)]
	select {
	case ch <- msg:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(kp.waitTimeout):
		return ErrWorkerQueueFull
	}
}

// Result is one run's JSON line, in keybus-bench's field names; each program
// fills the counters it keeps.
type Result struct {
	Transport       string  `json:"transport"`
	Scenario        string  `json:"scenario"`
	Events          uint64  `json:"events"`
	Aggregates      int     `json:"aggregates"`
	Seconds         float64 `json:"seconds"`
	EventsPerS      float64 `json:"events_per_s"`
	CPUNsPerEvent   float64 `json:"cpu_ns_per_event"`
	OrderViolations uint64  `json:"order_violations"`
	Lost            uint64  `json:"lost,omitempty"`
	Duplicates      uint64  `json:"duplicates,omitempty"`
	Retries         uint64  `json:"publish_retries,omitempty"`
}

// CPUSeconds is the process's user + system CPU time.
func CPUSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

// Aggregates of a scenario: single 1, multi 100, mixed 3 (0: unknown).
func Aggregates(scenario string) int {
	return map[string]int{"single": 1, "multi": 100, "mixed": 3}[scenario]
}

// Key is aggregate a's ID, as keybus-bench names it.
func Key(scenario string, a int) string {
	if scenario == "mixed" {
		return [...]string{"order-", "user-", "product-sku-"}[a%3] + strconv.Itoa(a)
	}
	return "order-" + strconv.Itoa(a)
}

// Plan calls publish for every event in keybus-bench's order: aggregate a gets
// events/aggs events (the first events%aggs one more), round by round, in a
// shuffled order per round for mixed.
func Plan(scenario string, events uint64, aggs int, publish func(a int, seq uint64)) {
	count := func(a int) uint64 {
		n := events / uint64(aggs)
		if uint64(a) < events%uint64(aggs) {
			n++
		}
		return n
	}
	rounds := (events + uint64(aggs) - 1) / uint64(aggs)
	order := make([]int, aggs)
	rng := uint64(0x9e3779b97f4a7c15)
	for r := uint64(0); r < rounds; r++ {
		n := 0
		for a := 0; a < aggs; a++ {
			if r < count(a) {
				order[n] = a
				n++
			}
		}
		if scenario == "mixed" {
			for i := n; i > 1; i-- {
				rng ^= rng << 13
				rng ^= rng >> 7
				rng ^= rng << 17
				j := int(rng % uint64(i))
				order[i-1], order[j] = order[j], order[i-1]
			}
		}
		for _, a := range order[:n] {
			publish(a, r)
		}
	}
}
