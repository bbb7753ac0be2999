// gonsq_latency: go-nsq's side of bench/latency.py, an open-loop latency benchmark.
//
// Modes:
//
//	pub  Producer.PublishAsync at a fixed rate: message i is due at start + i/rate (CLOCK_MONOTONIC),
//	     planned in advance, so a late send still counts from its due time (no coordinated omission).
//	     Publish latency: due time to the answer arriving on the done channel. With -publishers N,
//	     N goroutines take the messages in turn and call the synchronous Publish instead.
//	sub  Consumer with a handler: end-to-end latency = arrival in the handler - the due time the
//	     body carries. Stops after -count messages or -drain after the last one was due.
//
// Bodies: -size bytes; the first 8 are the due time (CLOCK_MONOTONIC ns, big-endian), the next 8
// the message number, the same layout bench/latency_driver.py writes and reads, so publishers and
// consumers of either client can be mixed.
//
// Prints one JSON line: the latencies (ns) of the messages due in the measuring window, summarised
// as percentiles, the achieved rate over that window, and the process's CPU (getrusage).
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nsqio/go-nsq"
	"golang.org/x/sys/unix"
)

var (
	mode          = flag.String("mode", "sub", "pub|sub")
	tcpAddress    = flag.String("nsqd-tcp-address", "127.0.0.1:4150", "<addr>:<port> of nsqd TCP")
	topic         = flag.String("topic", "latency", "topic")
	channel       = flag.String("channel", "ch", "channel (sub)")
	rate          = flag.Float64("rate", 1000, "messages per second (pub); the schedule's rate (sub)")
	startNs       = flag.Int64("start-ns", 0, "CLOCK_MONOTONIC ns at which message 0 is due")
	warmup        = flag.Duration("warmup", time.Second, "not measured, from start")
	window        = flag.Duration("window", 3*time.Second, "measured, after the warm-up")
	cooldown      = flag.Duration("cooldown", 500*time.Millisecond, "published after the window, not measured (the window's last messages must not be the last ones buffered)")
	size          = flag.Int("size", 100, "body size in bytes (>= 16)")
	maxInFlight   = flag.Int("max-in-flight", 2500, "sub: Config.MaxInFlight")
	outBufSize    = flag.Int64("output-buffer-size", 0, "sub: Config.OutputBufferSize (0: go-nsq's default, 16384; -1 disables)")
	outBufTimeout = flag.Duration("output-buffer-timeout", 0, "sub: Config.OutputBufferTimeout (0: go-nsq's default, 250ms; negative disables)")
	drain         = flag.Duration("drain", 10*time.Second, "sub: stop this long after the last message was due")
	logLevel      = flag.String("log-level", "error", "go-nsq log level: debug|info|warn|error")
	publishers    = flag.Int("publishers", 0, "pub: 0 = PublishAsync from one goroutine; N = Publish (synchronous) from N goroutines taking the schedule's messages in turn")
)

// monotonic returns CLOCK_MONOTONIC in ns, the clock the Python side reads with time.monotonic_ns():
// one clock_gettime at start, then Go's own monotonic clock for the increments (no syscall each time).
var monoBase, monoAt = func() (int64, time.Time) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		log.Fatalf("clock_gettime: %s", err)
	}
	return ts.Nano(), time.Now()
}()

func monotonic() int64 { return monoBase + int64(time.Since(monoAt)) }

type summary struct {
	Mode       string             `json:"mode"`
	Client     string             `json:"client"`
	Rate       float64            `json:"rate"`
	Count      int64              `json:"count"`
	Done       int64              `json:"done"`
	InWindow   int                `json:"in_window"`
	Achieved   float64            `json:"achieved_rate"`
	LatencyMs  map[string]float64 `json:"latency_ms"`
	ThirdsP50  []float64          `json:"thirds_p50_ms"`
	CPUUserS   float64            `json:"cpu_user_s"`
	CPUSysS    float64            `json:"cpu_sys_s"`
	Errors     int64              `json:"errors"`
	Config     map[string]any     `json:"config"`
	LateSendMs float64            `json:"late_send_p99_ms,omitempty"`
}

func rusage() (float64, float64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatalf("getrusage: %s", err)
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime), tv(ru.Stime)
}

func count() int64 { return int64(math.Round(*rate * (*warmup + *window + *cooldown).Seconds())) }

func due(i int64) int64 { return *startNs + int64(float64(i)*1e9 / *rate) }

func windowBounds() (int64, int64) {
	lo := *startNs + int64(*warmup)
	return lo, lo + int64(*window)
}

// percentiles of latencies in ns, reported in ms: p50, p99, p99.9 and max, nearest rank.
func percentiles(lat []int64) map[string]float64 {
	out := map[string]float64{}
	if len(lat) == 0 {
		return out
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	rank := func(q float64) float64 {
		k := int(math.Ceil(q*float64(len(lat)))) - 1
		if k < 0 {
			k = 0
		}
		return float64(lat[k]) / 1e6
	}
	out["p50"], out["p99"], out["p999"] = rank(0.50), rank(0.99), rank(0.999)
	out["max"] = float64(lat[len(lat)-1]) / 1e6
	return out
}

// thirds: the median latency of each third of the window, in due order: a rising row is a
// backlog that grows (the rate is beyond what the pair of clients and nsqd keep up with).
func thirds(dues, lat []int64) []float64 {
	lo, hi := windowBounds()
	parts := make([][]int64, 3)
	for i, d := range dues {
		k := int(3 * (d - lo) / (hi - lo))
		if k > 2 {
			k = 2
		}
		parts[k] = append(parts[k], lat[i])
	}
	out := make([]float64, 3)
	for k, p := range parts {
		out[k] = percentiles(p)["p50"]
	}
	return out
}

func body(i int64) []byte {
	b := make([]byte, *size)
	binary.BigEndian.PutUint64(b[0:8], uint64(due(i)))
	binary.BigEndian.PutUint64(b[8:16], uint64(i))
	for k := 16; k < len(b); k++ {
		b[k] = 'a' + byte(k%26)
	}
	return b
}

func publish() summary {
	cfg := nsq.NewConfig()
	p, err := nsq.NewProducer(*tcpAddress, cfg)
	if err != nil {
		log.Fatalf("NewProducer: %s", err)
	}
	p.SetLogger(log.New(os.Stderr, "", log.LstdFlags), nsqLogLevel())
	if err := p.Ping(); err != nil {
		log.Fatalf("connect: %s", err)
	}
	n := count()
	lo, hi := windowBounds()
	doneChan := make(chan *nsq.ProducerTransaction, 65536)
	acks := make([]int64, n)
	sent := make([]int64, n)
	var errors int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the answers, in order
		defer wg.Done()
		for k := int64(0); k < n; k++ {
			t := <-doneChan
			i := t.Args[0].(int64)
			acks[i] = monotonic()
			if t.Error != nil {
				errors++
			}
		}
	}()
	u0, s0 := rusage()
	api := "Producer.PublishAsync"
	if *publishers > 0 {
		api = fmt.Sprintf("Producer.Publish from %d goroutines", *publishers)
		publishFromGoroutines(p, n, sent, doneChan)
	} else {
		for i := int64(0); i < n; i++ {
			d := due(i)
			if wait := d - monotonic(); wait > 0 {
				time.Sleep(time.Duration(wait))
			}
			sent[i] = monotonic()
			if err := p.PublishAsync(*topic, body(i), doneChan, i); err != nil {
				log.Fatalf("PublishAsync: %s", err)
			}
		}
	}
	wg.Wait()
	u1, s1 := rusage()
	p.Stop()
	var lat, dues, late []int64
	inWindowSent := 0
	for i := int64(0); i < n; i++ {
		d := due(i)
		if d >= lo && d < hi {
			lat = append(lat, acks[i]-d)
			dues = append(dues, d)
			late = append(late, sent[i]-d)
		}
		if sent[i] >= lo && sent[i] < hi {
			inWindowSent++
		}
	}
	th := thirds(dues, lat)
	return summary{
		Mode: "pub", Client: "go-nsq", Rate: *rate, Count: n, Done: n, InWindow: len(lat),
		Achieved: float64(inWindowSent) / window.Seconds(), LatencyMs: percentiles(lat), ThirdsP50: th,
		CPUUserS: u1 - u0, CPUSysS: s1 - s0, Errors: errors, LateSendMs: percentiles(late)["p99"],
		Config: map[string]any{"api": api},
	}
}

// publishFromGoroutines is how a Go server publishes from its request handlers: each of
// -publishers goroutines takes the next message of the schedule, waits until it is due and
// calls the synchronous Publish; the answer goes to doneChan as PublishAsync's would.
func publishFromGoroutines(p *nsq.Producer, n int64, sent []int64, doneChan chan *nsq.ProducerTransaction) {
	var next int64 = -1
	var group sync.WaitGroup
	for g := 0; g < *publishers; g++ {
		group.Add(1)
		go func() {
			defer group.Done()
			for {
				i := atomic.AddInt64(&next, 1)
				if i >= n {
					return
				}
				if wait := due(i) - monotonic(); wait > 0 {
					time.Sleep(time.Duration(wait))
				}
				sent[i] = monotonic()
				err := p.Publish(*topic, body(i))
				doneChan <- &nsq.ProducerTransaction{Error: err, Args: []interface{}{i}}
			}
		}()
	}
	group.Wait()
}

type handler struct {
	mu       sync.Mutex
	n        int64
	target   int64
	dues     []int64
	lat      []int64
	received []int64
	done     chan struct{}
}

func (h *handler) HandleMessage(m *nsq.Message) error {
	now := monotonic()
	d := int64(binary.BigEndian.Uint64(m.Body[0:8]))
	h.mu.Lock()
	h.dues = append(h.dues, d)
	h.lat = append(h.lat, now-d)
	h.received = append(h.received, now)
	h.n++
	if h.n == h.target {
		close(h.done)
	}
	h.mu.Unlock()
	return nil // => FIN
}

func consume() summary {
	cfg := nsq.NewConfig()
	cfg.MaxInFlight = *maxInFlight
	if *outBufSize != 0 {
		cfg.OutputBufferSize = *outBufSize
	}
	if *outBufTimeout != 0 {
		cfg.OutputBufferTimeout = *outBufTimeout
	}
	c, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatalf("NewConsumer: %s", err)
	}
	c.SetLogger(log.New(os.Stderr, "", log.LstdFlags), nsqLogLevel())
	n := count()
	h := &handler{target: n, done: make(chan struct{})}
	c.AddHandler(h)
	if err := c.ConnectToNSQD(*tcpAddress); err != nil {
		log.Fatalf("ConnectToNSQD: %s", err)
	}
	fmt.Println("READY")
	u0, s0 := rusage()
	last := due(n - 1)
	select {
	case <-h.done:
	case <-time.After(time.Duration(last-monotonic()) + *drain):
	}
	u1, s1 := rusage()
	c.Stop()
	<-c.StopChan
	h.mu.Lock()
	defer h.mu.Unlock()
	lo, hi := windowBounds()
	var lat, dues []int64
	receivedInWindow := 0
	for i, d := range h.dues {
		if d >= lo && d < hi {
			lat = append(lat, h.lat[i])
			dues = append(dues, d)
		}
		if r := h.received[i]; r >= lo && r < hi {
			receivedInWindow++
		}
	}
	expected := 0
	for i := int64(0); i < n; i++ {
		if d := due(i); d >= lo && d < hi {
			expected++
		}
	}
	s := summary{
		Mode: "sub", Client: "go-nsq", Rate: *rate, Count: n, Done: h.n, InWindow: len(lat),
		Achieved: float64(receivedInWindow) / window.Seconds(), LatencyMs: percentiles(lat),
		ThirdsP50: thirds(dues, lat), CPUUserS: u1 - u0, CPUSysS: s1 - s0,
		Config: map[string]any{
			"api": "Consumer.AddHandler", "max_in_flight": cfg.MaxInFlight,
			"output_buffer_size": cfg.OutputBufferSize, "output_buffer_timeout_ms": cfg.OutputBufferTimeout.Milliseconds(),
		},
	}
	s.Errors = int64(expected - len(lat)) // due in the window and never received
	return s
}

func nsqLogLevel() nsq.LogLevel {
	switch *logLevel {
	case "debug":
		return nsq.LogLevelDebug
	case "info":
		return nsq.LogLevelInfo
	case "warn":
		return nsq.LogLevelWarning
	default:
		return nsq.LogLevelError
	}
}

func main() {
	flag.Parse()
	if *size < 16 {
		log.Fatal("-size must be >= 16 (due time and number)")
	}
	if *rate <= 0 || *startNs <= 0 {
		log.Fatal("-rate and -start-ns must be > 0")
	}
	var s summary
	switch *mode {
	case "pub":
		s = publish()
	case "sub":
		s = consume()
	default:
		log.Fatalf("unknown -mode %q", *mode)
	}
	out, _ := json.Marshal(s)
	fmt.Println("RESULT " + string(out))
}
