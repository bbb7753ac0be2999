// gonsq_recovery: go-nsq's side of bench/recovery.py, run with go-nsq's defaults.
//
// Modes:
//
//	sub  a Consumer (-lookupd-http-address, or -nsqd-tcp-address) whose handler returns nil: each
//	     message is FINed, which nsqd counts in its /stats (the bench's measure of a consumer).
//	pub  a Producer (-nsqd-tcp-address) calling the synchronous Publish every -interval; one JSON
//	     line per publish on stdout: {"t": CLOCK_MONOTONIC ns at its answer, "took": ns the call
//	     took, "ok": bool, "err": "..."}.
//
// -stats-every D (sub): one JSON line on stdout every D: {"t": CLOCK_MONOTONIC ns, "conns": the
// consumer's open connections (Stats().Connections)}; what bench/gray_failures.py reads as
// "noticed" (default 0: none).
//
// Runs until SIGTERM or SIGINT. -max-in-flight sets Config.MaxInFlight (sub; go-nsq's default 1).
// -client-id sets Config.ClientID (what the bench's counting listener reads from IDENTIFY to tell
// the clients' connection attempts apart).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nsqio/go-nsq"
	"golang.org/x/sys/unix"
)

var (
	mode        = flag.String("mode", "sub", "sub|pub")
	lookupdAddr = flag.String("lookupd-http-address", "", "sub: <addr>:<port> of nsqlookupd HTTP")
	nsqdAddr    = flag.String("nsqd-tcp-address", "", "<addr>:<port> of nsqd TCP")
	topic       = flag.String("topic", "recovery", "topic")
	channel     = flag.String("channel", "go", "channel (sub)")
	interval    = flag.Duration("interval", 50*time.Millisecond, "pub: one publish every interval")
	clientID    = flag.String("client-id", "", "Config.ClientID")
	maxInFlight = flag.Int("max-in-flight", 1, "sub: Config.MaxInFlight")
	logLevel    = flag.String("log-level", "error", "go-nsq log level: debug|info|warn|error")
	statsEvery  = flag.Duration("stats-every", 0, "sub: print the open connections this often (0: never)")
)

func monotonicNs() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		log.Fatal(err)
	}
	return ts.Nano()
}

func level() nsq.LogLevel {
	switch *logLevel {
	case "debug":
		return nsq.LogLevelDebug
	case "info":
		return nsq.LogLevelInfo
	case "warn":
		return nsq.LogLevelWarning
	}
	return nsq.LogLevelError
}

func config() *nsq.Config {
	cfg := nsq.NewConfig()
	if *clientID != "" {
		cfg.ClientID = *clientID
	}
	cfg.MaxInFlight = *maxInFlight
	return cfg
}

func consume(stop <-chan os.Signal) {
	consumer, err := nsq.NewConsumer(*topic, *channel, config())
	if err != nil {
		log.Fatal(err)
	}
	consumer.SetLogger(log.New(os.Stderr, "", log.LstdFlags), level())
	consumer.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error { return nil }))
	if *lookupdAddr != "" {
		err = consumer.ConnectToNSQLookupd(*lookupdAddr)
	} else {
		err = consumer.ConnectToNSQD(*nsqdAddr)
	}
	if err != nil {
		log.Fatal(err)
	}
	if *statsEvery > 0 {
		go printConnections(consumer)
	}
	<-stop
	consumer.Stop()
	<-consumer.StopChan
}

func printConnections(consumer *nsq.Consumer) {
	encoder := json.NewEncoder(os.Stdout)
	for range time.Tick(*statsEvery) {
		if encoder.Encode(map[string]int64{"t": monotonicNs(), "conns": int64(consumer.Stats().Connections)}) != nil {
			return
		}
	}
}

type outcome struct {
	T    int64  `json:"t"`
	Took int64  `json:"took"`
	OK   bool   `json:"ok"`
	Err  string `json:"err,omitempty"`
}

func publish(stop <-chan os.Signal) {
	producer, err := nsq.NewProducer(*nsqdAddr, config())
	if err != nil {
		log.Fatal(err)
	}
	producer.SetLogger(log.New(os.Stderr, "", log.LstdFlags), level())
	out := bufio.NewWriter(os.Stdout)
	encoder := json.NewEncoder(out)
	ticker := time.NewTicker(*interval)
	defer ticker.Stop()
	for n := 0; ; n++ {
		select {
		case <-stop:
			producer.Stop()
			out.Flush()
			return
		case <-ticker.C:
		}
		began := monotonicNs()
		err := producer.Publish(*topic, []byte("go-"+strconv.Itoa(n)))
		now := monotonicNs()
		result := outcome{T: now, Took: now - began, OK: err == nil}
		if err != nil {
			result.Err = err.Error()
		}
		if encoder.Encode(result) != nil {
			return
		}
		out.Flush()
	}
}

func main() {
	flag.Parse()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if *mode == "pub" {
		publish(stop)
	} else {
		consume(stop)
	}
}
