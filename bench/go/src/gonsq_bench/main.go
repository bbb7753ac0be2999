// gonsq_bench: go-nsq's Consumer and Producer as a throughput benchmark, the go-nsq library's rows
// of bench/run_all.py (through bench/peers/gonsq_driver.py) and bench/sync_publish.py.
//
// Modes:
//
//	consume  a Consumer with -handlers handler goroutines (AddConcurrentHandlers) and MaxInFlight
//	         -max-in-flight reads -count messages of a topic someone filled. The clock starts before
//	         NewConsumer: the connect, IDENTIFY, SUB and the first RDY are timed; it stops when a
//	         handler returns for the -count-th message (each handler returns nil: go-nsq FINs it).
//	pub      Producer.Publish (synchronous: PUB, then wait for OK) from -concurrency goroutines.
//	mpub     Producer.MultiPublish of -batch bodies (the last batch may be smaller), likewise.
//
// For pub and mpub every goroutine has a Producer of its own, or with -shared all share one; the
// producers connect (Ping) before the clock starts, so the clock covers the publishes only. The
// goroutines take the -count messages in turn (a message or a batch at a time) until none are left;
// the clock stops when the last publish has returned.
//
// Prints one JSON line: msgs, secs, msgs_per_s, cpu_user_s and cpu_sys_s (the process's own getrusage
// over the clock's window), and the settings. Exits 1 if a publish failed (after the line, whose
// "errors" is then not 0 and "msgs" counts the acknowledged messages; the first error goes to
// stderr), and 2 if the run has not finished after -timeout.
// -version prints go-nsq's version and exits.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nsqio/go-nsq"
)

var (
	mode        = flag.String("mode", "consume", "consume|pub|mpub")
	tcpAddress  = flag.String("nsqd-tcp-address", "127.0.0.1:4150", "<addr>:<port> of nsqd TCP")
	topic       = flag.String("topic", "gonsq_bench", "topic")
	channel     = flag.String("channel", "ch", "channel (consume)")
	count       = flag.Int64("count", 200000, "messages, in all")
	size        = flag.Int("size", 100, "body size in bytes (pub/mpub)")
	batch       = flag.Int("batch", 200, "bodies per MultiPublish (mpub)")
	concurrency = flag.Int("concurrency", 4, "publishing goroutines (pub/mpub)")
	shared      = flag.Bool("shared", false, "pub/mpub: the goroutines share one Producer (else one each)")
	handlers    = flag.Int("handlers", 1, "consume: handler goroutines (AddConcurrentHandlers)")
	maxInFlight = flag.Int("max-in-flight", 2500, "consume: Config.MaxInFlight")
	timeout     = flag.Duration("timeout", 10*time.Minute, "exit 2 if the run has not finished by then")
	logLevel    = flag.String("log-level", "error", "go-nsq's log level: debug|info|warn|error")
	version     = flag.Bool("version", false, "print go-nsq's version and exit")
)

type result struct {
	Mode      string         `json:"mode"`
	Client    string         `json:"client"`
	Msgs      int64          `json:"msgs"`
	Secs      float64        `json:"secs"`
	MsgsPerS  float64        `json:"msgs_per_s"`
	CPUUserS  float64        `json:"cpu_user_s"`
	CPUSysS   float64        `json:"cpu_sys_s"`
	Errors    int64          `json:"errors"`
	Settings  map[string]any `json:"settings"`
	ClockFrom string         `json:"clock_from"`
}

// window is a stretch of wall time and the process's CPU time over it.
type window struct {
	start       time.Time
	user0, sys0 float64
	secs        float64
	user1, sys1 float64
}

func rusage() (float64, float64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatalf("getrusage: %s", err)
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return seconds(ru.Utime), seconds(ru.Stime)
}

func startClock() *window {
	w := &window{}
	w.user0, w.sys0 = rusage()
	w.start = time.Now()
	return w
}

func (w *window) stop() {
	w.secs = time.Since(w.start).Seconds()
	w.user1, w.sys1 = rusage()
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

func newLogger() *log.Logger { return log.New(os.Stderr, "", log.LstdFlags) }

// ---- consume ----------------------------------------------------------------------------------

type counter struct {
	target int64
	seen   int64
	done   chan struct{}
	once   sync.Once
	w      *window
}

func (c *counter) HandleMessage(m *nsq.Message) error {
	if atomic.AddInt64(&c.seen, 1) == c.target {
		c.once.Do(func() {
			c.w.stop()
			close(c.done)
		})
	}
	return nil
}

func consume() (*window, int64, int64) {
	cfg := nsq.NewConfig()
	cfg.MaxInFlight = *maxInFlight
	h := &counter{target: *count, done: make(chan struct{})}
	h.w = startClock()
	c, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatalf("NewConsumer: %s", err)
	}
	c.SetLogger(newLogger(), nsqLogLevel())
	c.AddConcurrentHandlers(h, *handlers)
	if err := c.ConnectToNSQD(*tcpAddress); err != nil {
		log.Fatalf("ConnectToNSQD: %s", err)
	}
	<-h.done
	c.Stop()
	select {
	case <-c.StopChan:
	case <-time.After(5 * time.Second):
		log.Printf("the consumer did not stop within 5 s (the result stands)")
	}
	return h.w, *count, 0
}

// ---- pub / mpub -------------------------------------------------------------------------------

func publish() (*window, int64, int64) {
	cfg := nsq.NewConfig()
	n := *concurrency
	if n < 1 {
		n = 1
	}
	producers := make([]*nsq.Producer, n)
	for i := range producers {
		if *shared && i > 0 {
			producers[i] = producers[0]
			continue
		}
		p, err := nsq.NewProducer(*tcpAddress, cfg)
		if err != nil {
			log.Fatalf("NewProducer: %s", err)
		}
		p.SetLogger(newLogger(), nsqLogLevel())
		if err := p.Ping(); err != nil { // connects (IDENTIFY included) before the clock
			log.Fatalf("connect to %s: %s", *tcpAddress, err)
		}
		producers[i] = p
	}
	body := make([]byte, *size)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	step := int64(1)
	if *mode == "mpub" {
		step = int64(*batch)
		if step < 1 {
			step = 1
		}
	}
	bodies := make([][]byte, step)
	for i := range bodies {
		bodies[i] = body
	}
	var claimed, published, errors int64
	var firstError sync.Once
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(p *nsq.Producer) {
			defer wg.Done()
			<-start
			for {
				upTo := atomic.AddInt64(&claimed, step)
				take := step
				if upTo > *count {
					take = *count - (upTo - step)
				}
				if take <= 0 {
					return
				}
				var err error
				if *mode == "mpub" {
					err = p.MultiPublish(*topic, bodies[:take])
				} else {
					err = p.Publish(*topic, body)
				}
				if err != nil {
					atomic.AddInt64(&errors, 1)
					firstError.Do(func() { log.Printf("publish failed: %s", err) })
					return
				}
				atomic.AddInt64(&published, take)
			}
		}(producers[i])
	}
	w := startClock()
	close(start)
	wg.Wait()
	w.stop()
	for i, p := range producers {
		if !*shared || i == 0 {
			p.Stop()
		}
	}
	if published != *count && errors == 0 {
		log.Fatalf("published %d of %d messages", published, *count)
	}
	return w, published, errors
}

func main() {
	flag.Parse()
	if *version {
		fmt.Printf("go-nsq v%s\n", nsq.VERSION)
		return
	}
	if *count < 1 {
		log.Fatalf("-count must be at least 1")
	}
	time.AfterFunc(*timeout, func() {
		log.Printf("not finished after %s", *timeout)
		os.Exit(2)
	})
	settings := map[string]any{"nsqd_tcp_address": *tcpAddress, "topic": *topic, "count": *count}
	var w *window
	var msgs, errors int64
	switch *mode {
	case "consume":
		settings["channel"], settings["max_in_flight"], settings["handlers"] = *channel, *maxInFlight, *handlers
		w, msgs, errors = consume()
	case "pub", "mpub":
		settings["size"], settings["concurrency"], settings["shared"] = *size, *concurrency, *shared
		if *mode == "mpub" {
			settings["batch"] = *batch
		}
		w, msgs, errors = publish()
	default:
		log.Fatalf("-mode: consume, pub or mpub, not %q", *mode)
	}
	clockFrom := "the first publish (the producers connected before); to the last publish's answer"
	if *mode == "consume" {
		clockFrom = "before NewConsumer (connect, SUB and RDY timed); to the count-th message handled"
	}
	out := result{
		Mode: *mode, Client: "go-nsq v" + nsq.VERSION, Msgs: msgs, Secs: w.secs,
		CPUUserS: w.user1 - w.user0, CPUSysS: w.sys1 - w.sys0, Errors: errors,
		Settings: settings, ClockFrom: clockFrom,
	}
	if w.secs > 0 {
		out.MsgsPerS = float64(out.Msgs) / w.secs
	}
	line, err := json.Marshal(out)
	if err != nil {
		log.Fatalf("json: %s", err)
	}
	fmt.Println(string(line))
	if errors > 0 {
		os.Exit(1)
	}
}
