// origin-go-nats: the origin's whole pipeline (seed 001: NATS JetStream and a
// keyed worker pool) in Go with nats.go, the yardstick of keybus's
// nats.publish_batch = 1 (one JetStream message per event). One publisher
// async-publishes every event (js.PublishMsgAsync, 16,384 in flight, the key
// in a Kb-Key header as keybus and baseline:nats-raw write it) to one subject
// of a file-storage stream; a durable pull consumer (AckExplicit) on a second
// connection fetches batches of 1,024 and hands each message to the origin's
// KeyedWorkerPool (bench/origin_go/pool), whose handler checks its aggregate's
// order and acks it (+ACK, no round trip). The plan is keybus-bench's. With
// -msgid, -partitions 8 and -ack-every 16 it also does, one switch at a time,
// what keybus's documented layout asks of the server: a Nats-Msg-Id per
// message, partition subjects read through a wildcard filter, AckAll (of the
// ack-every-th handled message: a measure of server cost, not a safe ack
// policy, since handlers finish out of stream order). It prints one JSON line:
// events/s from the first publish to the last handled event and process CPU
// (getrusage) per event, as keybus-bench's rows. Build: docs/benchmarks.md,
// "NATS one message per event".
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"keybus/bench/origin_go/pool"
)

// layout: what keybus's documented design adds on the server, each one a switch.
type layout struct {
	msgID      bool // a Nats-Msg-Id per message (the stream's dedup)
	partitions int  // publish to <subject>.<FNV-32a(key) mod N>, read through <subject>.*
	ackEvery   int  // AckAll every ackEvery-th handled message (1: +ACK each)
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "origin-go-nats:", err)
		os.Exit(2)
	}
}

func run(url, scenario string, events uint64, aggs, payloadBytes int, lay layout) pool.Result {
	pubNC, err := nats.Connect(url)
	must(err)
	defer pubNC.Close()
	subNC, err := nats.Connect(url)
	must(err)
	defer subNC.Close()
	js, err := pubNC.JetStream(nats.PublishAsyncMaxPending(16384))
	must(err)
	sjs, err := subNC.JetStream()
	must(err)
	tag := strconv.Itoa(os.Getpid()) + "_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	stream, subject := "ORIGIN_"+tag, "origin."+tag
	streamSubj, ackPolicy := subject, nats.AckExplicitPolicy
	if lay.partitions > 0 {
		streamSubj = subject + ".*"
	}
	if lay.ackEvery > 1 {
		ackPolicy = nats.AckAllPolicy
	}
	_, err = js.AddStream(&nats.StreamConfig{Name: stream, Subjects: []string{streamSubj}, Storage: nats.FileStorage})
	must(err)
	defer js.DeleteStream(stream)
	cc := &nats.ConsumerConfig{Durable: "origin", AckPolicy: ackPolicy, MaxAckPending: 65536, MaxWaiting: 512}
	if lay.partitions > 0 {
		cc.FilterSubject = streamSubj
	}
	_, err = js.AddConsumer(stream, cc)
	must(err)
	sub, err := sjs.PullSubscribe(streamSubj, "origin", nats.Bind(stream, "origin"))
	must(err)

	next := make([]uint64, aggs) // each aggregate is handled by one goroutine only
	var handled, violations, dups uint64
	kp := pool.NewKeyedWorkerPool(1024, 1000, 200*time.Millisecond, func(m *pool.AggregateMessage) {
		switch {
		case m.Seq < next[m.Agg]:
			atomic.AddUint64(&dups, 1)
		case m.Seq > next[m.Agg]:
			atomic.AddUint64(&violations, 1)
		}
		if m.Seq >= next[m.Agg] {
			next[m.Agg] = m.Seq + 1
		}
		if n := atomic.AddUint64(&handled, 1); lay.ackEvery <= 1 || n%uint64(lay.ackEvery) == 0 || n == events {
			_ = m.Ref.(*nats.Msg).Ack()
		}
	})
	ctx := context.Background()
	var stop int32
	go func() { // the consumer: fetch, then hand each message to the keyed pool
		for atomic.LoadInt32(&stop) == 0 {
			msgs, err := sub.Fetch(1024, nats.MaxWait(200*time.Millisecond))
			if err != nil && !errors.Is(err, nats.ErrTimeout) {
				continue
			}
			for _, msg := range msgs {
				d := msg.Data
				m := &pool.AggregateMessage{AggregateID: msg.Header.Get("Kb-Key"),
					Agg: int(binary.LittleEndian.Uint32(d[0:])), Seq: binary.LittleEndian.Uint64(d[4:]),
					Payload: d, Ref: msg}
				for kp.ProcessMessage(ctx, m) != nil {
				}
			}
		}
	}()

	keys, subjects := make([]string, aggs), make([]string, aggs)
	for a := range keys {
		keys[a] = pool.Key(scenario, a)
		subjects[a] = subject
		if lay.partitions > 0 {
			h := fnv.New32a()
			_, _ = h.Write([]byte(keys[a]))
			subjects[a] = subject + "." + strconv.Itoa(int(h.Sum32()%uint32(lay.partitions)))
		}
	}
	var msgSeq uint64
	cpu0, t0 := pool.CPUSeconds(), time.Now()
	pool.Plan(scenario, events, aggs, func(a int, seq uint64) {
		p := make([]byte, payloadBytes)
		binary.LittleEndian.PutUint32(p[0:], uint32(a))
		binary.LittleEndian.PutUint64(p[4:], seq)
		binary.LittleEndian.PutUint64(p[12:], uint64(time.Now().UnixNano()))
		m := nats.NewMsg(subjects[a])
		m.Header.Set("Kb-Key", keys[a])
		if lay.msgID {
			msgSeq++
			m.Header.Set(nats.MsgIdHdr, tag+".0-"+strconv.FormatUint(msgSeq, 10))
		}
		m.Data = p
		_, err := js.PublishMsgAsync(m, nats.StallWait(10*time.Second))
		must(err)
	})
	deadline := time.Now().Add(60 * time.Second)
	for atomic.LoadUint64(&handled) < events && time.Now().Before(deadline) {
		time.Sleep(50 * time.Microsecond)
	}
	secs := time.Since(t0).Seconds()
	cpu := pool.CPUSeconds() - cpu0
	atomic.StoreInt32(&stop, 1)
	h, d := atomic.LoadUint64(&handled), atomic.LoadUint64(&dups)
	var lost uint64
	if h-d < events {
		lost = events - (h - d)
	}
	return pool.Result{Transport: "baseline:origin-go-nats", Scenario: scenario, Events: events, Aggregates: aggs,
		Seconds: secs, EventsPerS: float64(h) / secs, CPUNsPerEvent: cpu * 1e9 / float64(h),
		OrderViolations: atomic.LoadUint64(&violations), Lost: lost, Duplicates: d}
}

func main() {
	url := flag.String("url", nats.DefaultURL, "nats-server URL")
	scenario := flag.String("scenario", "multi", "single | multi | mixed")
	events := flag.Uint64("events", 50000, "events per run")
	payload := flag.Int("payload-bytes", 64, "bytes per event (at least 20)")
	msgID := flag.Bool("msgid", false, "a Nats-Msg-Id header per message, as keybus writes")
	parts := flag.Int("partitions", 0, "publish to <subject>.<FNV-32a(key) mod N>, read through <subject>.* (0: one subject)")
	ackEvery := flag.Int("ack-every", 1, "AckAll every N handled messages (1: +ACK each, AckExplicit)")
	flag.Parse()
	aggs := pool.Aggregates(*scenario)
	if aggs == 0 || *payload < 20 {
		fmt.Fprintln(os.Stderr, "origin-go-nats: -scenario single | multi | mixed, -payload-bytes >= 20")
		os.Exit(2)
	}
	r := run(*url, *scenario, *events, aggs, *payload, layout{*msgID, *parts, *ackEvery})
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if r.OrderViolations > 0 || r.Lost > 0 || r.Duplicates > 0 {
		os.Exit(1)
	}
}
