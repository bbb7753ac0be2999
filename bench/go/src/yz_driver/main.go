// yz_driver: youzan/go-nsq's Consumer and Producer, driven by fastnsq's interop tests and benchmarks.
//
// Built in GOPATH mode against youzan/go-nsq's public source (v1.7.2-HA, as
// a GOPATH holding youzan/go-nsq v1.7.2-HA and its dependencies), outside the checkout; see bench/yz_driver.py.
//
// Modes (one JSON object per line on stdout):
//
//	pub            reads publish requests, one JSON object a line, from stdin; answers each
//	               {"kind":"plain|partition|sharded|trace|ext|mpub|background","body":b64,...}
//	sub            consumes and prints every message (body, ids, partition, offset, ext) until
//	               -count messages or -idle without one; then {"summary":true,...}
//	bench-consume  consumes -count messages with a trivial handler; one result line
//	bench-pub      -concurrency goroutines share one TopicProducerMgr and publish -count messages
//	               of -size bytes (-sharded: PublishOrdered with a key per goroutine); one result line
//
// The result lines of the bench modes: {"mode","msgs","secs","msgs_per_s","cpu_user_s","cpu_sys_s",...}
// with CPU from getrusage(RUSAGE_SELF) over the measured phase only.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spaolacci/murmur3"
	nsq "github.com/youzan/go-nsq"
)

var (
	mode           = flag.String("mode", "sub", "pub|sub|bench-consume|bench-pub")
	lookupd        = flag.String("lookupd", "", "nsqlookupd HTTP address")
	nsqdAddr       = flag.String("nsqd", "", "sub: an nsqd TCP address to connect to directly (with -partition)")
	topic          = flag.String("topic", "", "topic")
	channel        = flag.String("channel", "ch", "channel (sub)")
	partition      = flag.Int("partition", -1, "sub: consume this partition only (NewPartitionConsumer)")
	count          = flag.Int64("count", 0, "sub/bench: stop after this many messages")
	idle           = flag.Duration("idle", 5*time.Second, "sub: stop after this long without a message")
	ordered        = flag.Bool("ordered", false, "sub/bench-consume: EnableOrdered (SUB_ORDERED)")
	trace          = flag.Bool("trace", false, "sub: EnableTrace (SUB_ADVANCED: offsets on every message)")
	offset         = flag.String("offset", "", "sub: SetConsumeOffset, type:value (timestamp:S, virtual_queue:N, special:-1)")
	offsetParts    = flag.String("offset-partitions", "0", "sub: the partitions -offset is set for, comma separated")
	consumeExt     = flag.Bool("ext", false, "sub: SetConsumeExt(true) (with -nsqd, where no lookupd says)")
	maxInFlight    = flag.Int("max-in-flight", 200, "sub/bench-consume: MaxInFlight")
	compressCodec  = flag.String("compress-codec", "not_specified", "pub: ClientCompressDecodec")
	compressTopics = flag.String("compress-topics", "", "pub: TopicsForCompress, comma separated")
	compressSize   = flag.Int("compress-size", 20480, "pub: MessageSizeForCompress")
	poolSize       = flag.Int("pool-size", 2, "pub: ProducerPoolSize (go-nsq's default 2)")
	pubStrategy    = flag.Int("pub-strategy", 1, "pub: PubStrategy (0 round robin, 1 dynamic load: go-nsq's default)")
	concurrency    = flag.Int("concurrency", 1000, "bench-pub: publishing goroutines")
	size           = flag.Int("size", 100, "bench-pub: body size")
	sharded        = flag.Bool("sharded", false, "bench-pub: PublishOrdered with a sharding key per goroutine")
	handlers       = flag.Int("handlers", 1, "bench-consume: concurrent handlers")
	timeout        = flag.Duration("timeout", 10*time.Minute, "give up after this long (exit 2)")
)

var out = json.NewEncoder(os.Stdout)
var outMu sync.Mutex

func emit(v interface{}) {
	outMu.Lock()
	defer outMu.Unlock()
	if err := out.Encode(v); err != nil {
		log.Fatalf("stdout: %v", err)
	}
}

func config() *nsq.Config {
	c := nsq.NewConfig()
	c.LookupdPollInterval = time.Second
	c.MaxInFlight = *maxInFlight
	c.Hasher = murmur3.New32() // the hash fastnsq shards with (murmur3 32-bit, seed 0)
	c.ProducerPoolSize = *poolSize
	c.PubStrategy = *pubStrategy
	c.ClientCompressDecodec = *compressCodec
	c.MessageSizeForCompress = *compressSize
	if *compressTopics != "" {
		c.TopicsForCompress = strings.Split(*compressTopics, ",")
	}
	c.EnableOrdered = *ordered
	c.EnableTrace = *trace || *offset != ""
	return c
}

func quiet() *log.Logger { return log.New(os.Stderr, "yz_driver ", log.LstdFlags) }

// ---- pub ------------------------------------------------------------------------------------

type pubRequest struct {
	Kind      string                 `json:"kind"`
	Body      string                 `json:"body"`
	Bodies    []string               `json:"bodies"`
	Partition *int                   `json:"partition"`
	Key       string                 `json:"key"`
	TraceID   uint64                 `json:"trace_id"`
	Tag       string                 `json:"tag"`
	Ext       map[string]interface{} `json:"ext"`
}

type pubAnswer struct {
	OK     bool   `json:"ok"`
	Err    string `json:"err,omitempty"`
	ID     uint64 `json:"id,omitempty"`
	Offset uint64 `json:"offset,omitempty"`
	Size   uint32 `json:"size,omitempty"`
}

func decode(s string) []byte {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		log.Fatalf("bad base64 %q: %v", s, err)
	}
	return b
}

func runPub() {
	mgr, err := nsq.NewTopicProducerMgr([]string{*topic}, config())
	if err != nil {
		log.Fatal(err)
	}
	mgr.SetLogger(quiet(), nsq.LogLevelError)
	if err := mgr.ConnectToNSQLookupd(*lookupd); err != nil {
		log.Fatal(err)
	}
	defer mgr.Stop()
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 64<<20)
	for scanner.Scan() {
		var req pubRequest
		if err := json.Unmarshal(scanner.Bytes(), &req); err != nil {
			log.Fatalf("bad request: %v", err)
		}
		emit(publish(mgr, &req))
	}
}

func publish(mgr *nsq.TopicProducerMgr, req *pubRequest) pubAnswer {
	body := decode(req.Body)
	part := -1
	if req.Partition != nil {
		part = *req.Partition
	}
	var id nsq.NewMessageID
	var off uint64
	var size uint32
	var err error
	switch req.Kind {
	case "plain":
		err = mgr.Publish(*topic, body)
	case "partition":
		err = mgr.PublishWithPartitionId(*topic, part, body)
	case "sharded":
		id, off, size, err = mgr.PublishOrdered(*topic, []byte(req.Key), body)
	case "trace":
		if part >= 0 {
			id, off, size, err = mgr.PublishAndTraceWithPartitionId(*topic, part, req.TraceID, body)
		} else {
			id, off, size, err = mgr.PublishAndTrace(*topic, req.TraceID, body)
		}
	case "ext":
		ext := &nsq.MsgExt{TraceID: req.TraceID, DispatchTag: req.Tag, Custom: req.Ext}
		if ext.Custom == nil {
			ext.Custom = map[string]interface{}{}
		}
		if part >= 0 {
			id, off, size, err = mgr.PublishWithJsonExtAndPartitionId(*topic, part, body, ext)
		} else {
			id, off, size, err = mgr.PublishWithJsonExt(*topic, body, ext)
		}
	case "mpub":
		bodies := make([][]byte, len(req.Bodies))
		for i, b := range req.Bodies {
			bodies[i] = decode(b)
		}
		err = mgr.MultiPublish(*topic, bodies)
	case "background":
		err = mgr.PublishAndRetryBackground(*topic, body)
	default:
		err = fmt.Errorf("unknown kind %q", req.Kind)
	}
	if err != nil {
		return pubAnswer{Err: err.Error()}
	}
	return pubAnswer{OK: true, ID: uint64(id), Offset: off, Size: size}
}

// ---- sub ------------------------------------------------------------------------------------

type seen struct {
	Body       string `json:"body"`
	InternalID uint64 `json:"internal_id"`
	TraceID    uint64 `json:"trace_id"`
	Attempts   uint16 `json:"attempts"`
	Timestamp  int64  `json:"timestamp"`
	Partition  string `json:"partition"`
	Offset     uint64 `json:"offset"`
	RawSize    uint32 `json:"raw_size"`
	ExtVer     uint8  `json:"ext_ver"`
	Ext        string `json:"ext"`
}

func consumer() *nsq.Consumer {
	c, err := nsq.NewPartitionConsumer(*topic, *partition, *channel, config())
	if err != nil {
		log.Fatal(err)
	}
	c.SetLogger(quiet(), nsq.LogLevelError)
	if *consumeExt {
		c.SetConsumeExt(true)
	}
	if *offset != "" {
		parts := strings.SplitN(*offset, ":", 2)
		value, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			log.Fatalf("bad -offset %q", *offset)
		}
		var start nsq.ConsumeOffset
		switch parts[0] {
		case "timestamp":
			start.SetTime(value)
		case "virtual_queue":
			start.SetVirtualQueueOffset(value)
		case "special":
			start.SetToEnd()
		default:
			log.Fatalf("go-nsq has no start of type %q", parts[0])
		}
		for _, p := range strings.Split(*offsetParts, ",") {
			pid, err := strconv.Atoi(p)
			if err != nil {
				log.Fatalf("bad -offset-partitions %q", *offsetParts)
			}
			if err := c.SetConsumeOffset(pid, start); err != nil {
				log.Fatal(err)
			}
		}
	}
	return c
}

func connect(c *nsq.Consumer) {
	var err error
	if *nsqdAddr != "" {
		err = c.ConnectToNSQD(*nsqdAddr, *partition)
	} else {
		err = c.ConnectToNSQLookupd(*lookupd)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func runSub() {
	c := consumer()
	var got int64
	last := make(chan struct{}, 1)
	c.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		emit(seen{
			Body: base64.StdEncoding.EncodeToString(m.Body), InternalID: uint64(nsq.GetNewMessageID(m.ID[:])),
			TraceID: m.GetTraceID(), Attempts: m.Attempts, Timestamp: m.Timestamp, Partition: m.Partition,
			Offset: m.Offset, RawSize: m.RawSize, ExtVer: m.ExtVer, Ext: base64.StdEncoding.EncodeToString(m.ExtBytes),
		})
		if n := atomic.AddInt64(&got, 1); *count > 0 && n >= *count {
			select {
			case last <- struct{}{}:
			default:
			}
		}
		return nil
	}))
	connect(c)
	emit(map[string]interface{}{"ready": true})
	seenBefore := int64(0)
	for done := false; !done; {
		select {
		case <-last:
			time.Sleep(200 * time.Millisecond) // let the last FINs go out
			done = true
		case <-time.After(*idle):
			now := atomic.LoadInt64(&got)
			done = now == seenBefore
			seenBefore = now
		}
	}
	c.Stop()
	<-c.StopChan
	emit(map[string]interface{}{"summary": true, "count": atomic.LoadInt64(&got)})
}

// ---- benchmarks -------------------------------------------------------------------------------

type result struct {
	Mode        string  `json:"mode"`
	Msgs        int64   `json:"msgs"`
	Secs        float64 `json:"secs"`
	MsgsPerS    float64 `json:"msgs_per_s"`
	CPUUserS    float64 `json:"cpu_user_s"`
	CPUSysS     float64 `json:"cpu_sys_s"`
	Concurrency int     `json:"concurrency,omitempty"`
	MaxInFlight int     `json:"max_in_flight,omitempty"`
	Errors      int64   `json:"errors"`
}

func cpu() (float64, float64) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime), tv(ru.Stime)
}

func finish(r result, start time.Time, u0, s0 float64) {
	r.Secs = time.Since(start).Seconds()
	u1, s1 := cpu()
	r.CPUUserS, r.CPUSysS = u1-u0, s1-s0
	if r.Secs > 0 {
		r.MsgsPerS = float64(r.Msgs) / r.Secs
	}
	emit(r)
}

func runBenchConsume() {
	c := consumer()
	var got int64
	done := make(chan struct{})
	var once sync.Once
	c.AddConcurrentHandlers(nsq.HandlerFunc(func(m *nsq.Message) error {
		if atomic.AddInt64(&got, 1) == *count {
			once.Do(func() { close(done) })
		}
		return nil
	}), *handlers)
	u0, s0 := cpu()
	start := time.Now() // the SUB/RDY handshake is part of consuming, as in gonsq_bench
	connect(c)
	select {
	case <-done:
	case <-time.After(*timeout):
		log.Printf("timeout after %d messages", atomic.LoadInt64(&got))
		os.Exit(2)
	}
	finish(result{Mode: "consume", Msgs: *count, MaxInFlight: *maxInFlight}, start, u0, s0)
	c.Stop()
	select {
	case <-c.StopChan:
	case <-time.After(5 * time.Second):
	}
}

func runBenchPub() {
	mgr, err := nsq.NewTopicProducerMgr([]string{*topic}, config())
	if err != nil {
		log.Fatal(err)
	}
	mgr.SetLogger(quiet(), nsq.LogLevelError)
	if err := mgr.ConnectToNSQLookupd(*lookupd); err != nil {
		log.Fatal(err)
	}
	defer mgr.Stop()
	body := make([]byte, *size)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	// Warm up: every partition's connection pool opens before the clock starts.
	for i := 0; i < 50; i++ {
		if err := mgr.Publish(*topic, body); err != nil {
			log.Fatalf("warm-up publish: %v", err)
		}
	}
	var next, errors int64
	var wg sync.WaitGroup
	u0, s0 := cpu()
	start := time.Now()
	for g := 0; g < *concurrency; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			key := []byte(fmt.Sprintf("key-%d", g))
			for atomic.AddInt64(&next, 1) <= *count {
				var err error
				if *sharded {
					_, _, _, err = mgr.PublishOrdered(*topic, key, body)
				} else {
					err = mgr.Publish(*topic, body)
				}
				if err != nil {
					atomic.AddInt64(&errors, 1)
				}
			}
		}(g)
	}
	wg.Wait()
	mode := "pub"
	if *sharded {
		mode = "pub-sharded"
	}
	finish(result{Mode: mode, Msgs: *count, Concurrency: *concurrency, Errors: atomic.LoadInt64(&errors)},
		start, u0, s0)
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *topic == "" {
		log.Fatal("-topic is required")
	}
	go func() {
		time.Sleep(*timeout)
		log.Printf("timeout after %v", *timeout)
		os.Exit(2)
	}()
	switch *mode {
	case "pub":
		runPub()
	case "sub":
		runSub()
	case "bench-consume":
		runBenchConsume()
	case "bench-pub":
		runBenchPub()
	default:
		log.Fatalf("unknown -mode %q", *mode)
	}
}
