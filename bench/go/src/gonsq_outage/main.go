// gonsq_outage: go-nsq's side of bench/dependency_outage.py: a Consumer with go-nsq's defaults
// (but MaxInFlight) whose handler writes batches to PostgreSQL, the way a Go ingestion service
// batches with go-nsq: DisableAutoResponse, the messages gathered by -writers goroutines (each
// with its own PostgreSQL connection) into batches of -batch or -max-wait, one multi-row
// INSERT ... ON CONFLICT (id) DO NOTHING each; FIN on success, Requeue(-1) on failure (go-nsq's
// backoff and its default delay, 90 s x attempts).
//
// No PostgreSQL driver can be fetched here, so the program speaks the protocol's few messages
// itself (startup with trust authentication, simple Query): enough for one INSERT a batch. A
// connection that fails is dropped and opened again by the next batch.
//
// With -http-url, each batch is POSTed there instead (the bodies, one a line, and X-Ids: the
// events' ids, comma-separated, for the sink's access log), through net/http's default client;
// a status of 300 or more fails the batch as an error does.
//
// Runs until SIGTERM or SIGINT.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nsqio/go-nsq"
)

var (
	nsqdAddr    = flag.String("nsqd-tcp-address", "127.0.0.1:4150", "<addr>:<port> of nsqd TCP")
	topic       = flag.String("topic", "events", "topic")
	channel     = flag.String("channel", "go", "channel")
	pgAddr      = flag.String("pg-address", "127.0.0.1:5432", "<addr>:<port> of PostgreSQL (trust auth, user postgres)")
	maxInFlight = flag.Int("max-in-flight", 4000, "Config.MaxInFlight")
	batchSize   = flag.Int("batch", 400, "messages per INSERT at most")
	maxWait     = flag.Duration("max-wait", 250*time.Millisecond, "a batch is written this long after its first message")
	writers     = flag.Int("writers", 2, "goroutines writing batches, each with its own connection")
	httpURL     = flag.String("http-url", "", "POST each batch here instead of PostgreSQL (bodies one a line, X-Ids)")
	httpClient  = &http.Client{Timeout: 5 * time.Second}
)

type pg struct {
	conn net.Conn
}

func (p *pg) open() error {
	conn, err := net.DialTimeout("tcp", *pgAddr, time.Second)
	if err != nil {
		return err
	}
	params := "user\x00postgres\x00database\x00postgres\x00\x00"
	msg := make([]byte, 8+len(params))
	binary.BigEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.BigEndian.PutUint32(msg[4:], 196608) // protocol 3.0
	copy(msg[8:], params)
	if _, err := conn.Write(msg); err != nil {
		conn.Close()
		return err
	}
	p.conn = conn
	if err := p.untilReady(); err != nil {
		p.close()
		return err
	}
	return nil
}

func (p *pg) close() {
	if p.conn != nil {
		p.conn.Close()
		p.conn = nil
	}
}

// untilReady reads messages up to ReadyForQuery ('Z'); an ErrorResponse ('E') is the error.
func (p *pg) untilReady() error {
	var failure error
	head := make([]byte, 5)
	for {
		p.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(p.conn, head); err != nil {
			return err
		}
		body := make([]byte, int(binary.BigEndian.Uint32(head[1:]))-4)
		if _, err := io.ReadFull(p.conn, body); err != nil {
			return err
		}
		switch head[0] {
		case 'E':
			failure = errors.New("postgres: " + strings.ReplaceAll(string(body), "\x00", " "))
		case 'R':
			if binary.BigEndian.Uint32(body) != 0 {
				return errors.New("postgres: authentication other than trust asked for")
			}
		case 'Z':
			return failure
		}
	}
}

func (p *pg) exec(query string) error {
	if p.conn == nil {
		if err := p.open(); err != nil {
			return err
		}
	}
	msg := make([]byte, 5+len(query)+1)
	msg[0] = 'Q'
	binary.BigEndian.PutUint32(msg[1:], uint32(len(query)+5))
	copy(msg[5:], query)
	if _, err := p.conn.Write(msg); err != nil {
		p.close()
		return err
	}
	if err := p.untilReady(); err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			p.close()
		}
		return err
	}
	return nil
}

type event struct {
	ID      int64   `json:"id"`
	TS      float64 `json:"ts"`
	Payload string  `json:"payload"`
}

func insert(batch []*nsq.Message) string {
	var b strings.Builder
	b.WriteString("INSERT INTO events (id, ts, payload) VALUES ")
	for i, m := range batch {
		var e event
		if err := json.Unmarshal(m.Body, &e); err != nil {
			e.ID = -1
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "(%d,%s,'%s')", e.ID, strconv.FormatFloat(e.TS, 'f', -1, 64),
			strings.ReplaceAll(e.Payload, "'", "''"))
	}
	b.WriteString(" ON CONFLICT (id) DO NOTHING")
	return b.String()
}

func post(batch []*nsq.Message) error {
	var body bytes.Buffer
	ids := make([]string, 0, len(batch))
	for _, m := range batch {
		var e event
		if err := json.Unmarshal(m.Body, &e); err != nil {
			e.ID = -1
		}
		ids = append(ids, strconv.FormatInt(e.ID, 10))
		body.Write(m.Body)
		body.WriteByte('\n')
	}
	req, err := http.NewRequest("POST", *httpURL, &body)
	if err != nil {
		return err
	}
	req.Header.Set("X-Ids", strings.Join(ids, ","))
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

func write(messages <-chan *nsq.Message) {
	db := &pg{}
	for first := range messages {
		batch := []*nsq.Message{first}
		deadline := time.After(*maxWait)
	gather:
		for len(batch) < *batchSize {
			select {
			case m := <-messages:
				batch = append(batch, m)
			case <-deadline:
				break gather
			}
		}
		var err error
		if *httpURL != "" {
			err = post(batch)
		} else {
			err = db.exec(insert(batch))
		}
		if err != nil {
			log.Printf("batch of %d failed: %v; requeueing", len(batch), err)
			for _, m := range batch {
				m.Requeue(-1)
			}
			continue
		}
		for _, m := range batch {
			m.Finish()
		}
	}
}

func main() {
	flag.Parse()
	cfg := nsq.NewConfig()
	cfg.MaxInFlight = *maxInFlight
	consumer, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatal(err)
	}
	consumer.SetLogger(log.New(os.Stderr, "", log.LstdFlags), nsq.LogLevelWarning)
	messages := make(chan *nsq.Message, *maxInFlight)
	for i := 0; i < *writers; i++ {
		go write(messages)
	}
	consumer.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		m.DisableAutoResponse()
		messages <- m
		return nil
	}))
	if err := consumer.ConnectToNSQD(*nsqdAddr); err != nil {
		log.Fatal(err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	consumer.Stop()
	<-consumer.StopChan
}
