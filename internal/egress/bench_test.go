package egress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandloop/sandloop/internal/egress"
)

const benchBytes = 100 << 20

// BenchmarkEgress measures the proxy against straight loopback in the same
// run: the throughput of a 100 MiB download through a CONNECT tunnel (the
// path pip's and requests' HTTPS takes) against the same download without
// the proxy, and the latency a plain HTTP request on a new connection gains
// through it. (Run with -benchtime=Nx; each iteration does one of each.)
func BenchmarkEgress(b *testing.B) {
	blob := make([]byte, 1<<20)
	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer up.Close()
	go func() {
		for {
			c, err := up.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				line, _ := br.ReadString('\n')
				if strings.HasPrefix(line, "GET /small") {
					for {
						if l, err := br.ReadString('\n'); err != nil || l == "\r\n" {
							break
						}
					}
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
					return
				}
				for n := 0; n < benchBytes; n += len(blob) {
					if _, err := c.Write(blob); err != nil {
						return
					}
				}
			}()
		}
	}()
	target := up.Addr().String()
	al, _ := egress.ParseAllowlist([]string{target})
	g := egress.New(&egress.Options{Policy: egress.Policy{Allow: al, MaxBytes: 1 << 50}})
	pl, _ := net.Listen("tcp", "127.0.0.1:0")
	g.Serve(pl)
	defer g.Close()
	proxy := pl.Addr().String()

	download := func(viaProxy bool) time.Duration {
		start := time.Now()
		addr := target
		if viaProxy {
			addr = proxy
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		var r io.Reader = c
		if viaProxy {
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			br := bufio.NewReader(c)
			if line, _ := br.ReadString('\n'); !strings.Contains(line, " 200 ") {
				b.Fatalf("CONNECT: %q", line)
			}
			br.ReadString('\n')
			r = br
		}
		io.WriteString(c, "GET /big\r\n")
		n, err := io.Copy(io.Discard, r)
		if err != nil || n != benchBytes {
			b.Fatalf("read %d bytes: %v", n, err)
		}
		return time.Since(start)
	}
	client := func(viaProxy bool) *http.Client {
		tr := &http.Transport{DisableKeepAlives: true}
		if viaProxy {
			tr.Proxy = http.ProxyURL(mustURL("http://" + proxy))
		}
		return &http.Client{Transport: tr}
	}
	direct, through := client(false), client(true)
	request := func(c *http.Client) time.Duration {
		start := time.Now()
		resp, err := c.Get("http://" + target + "/small")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start)
	}
	download(false) // warm up both paths
	download(true)
	var dd, pd, dl, pl2 []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dd = append(dd, download(false))
		pd = append(pd, download(true))
		for j := 0; j < 20; j++ {
			dl = append(dl, request(direct))
			pl2 = append(pl2, request(through))
		}
	}
	b.StopTimer()
	mibs := func(d time.Duration) float64 { return float64(benchBytes) / (1 << 20) / d.Seconds() }
	dm, pm := median(dd), median(pd)
	b.ReportMetric(mibs(dm), "direct-MiB/s")
	b.ReportMetric(mibs(pm), "proxy-MiB/s")
	b.ReportMetric(mibs(pm)/mibs(dm), "proxy/direct")
	lat := float64(median(pl2)-median(dl)) / float64(time.Microsecond)
	b.ReportMetric(lat, "added-µs/request")
	b.Logf("100 MiB download, median of %d: direct %.0f MiB/s, through the proxy %.0f MiB/s (%.0f%%); a request on a new connection: direct %s, through the proxy %s (+%.0f µs)",
		b.N, mibs(dm), mibs(pm), 100*mibs(pm)/mibs(dm), median(dl).Round(time.Microsecond), median(pl2).Round(time.Microsecond), lat)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}
