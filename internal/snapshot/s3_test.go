package snapshot

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The S3 backend is tested against a real S3 server on loopback:
// SeaweedFS's weed, built from its Go module in testdata/weed (its own
// go.mod, so its dependencies stay out of sandloop's) by `make weed`
// (make test and make test-s3 run it). Without the binary the S3 half of
// each test skips, saying so. SANDLOOP_WEED names another binary.

const (
	weedKey    = "sandloop-test"
	weedSecret = "sandloop-test-secret"
	weedBucket = "sandloop-snapshots"
)

var weed struct {
	once     sync.Once
	cmd      *exec.Cmd
	dir      string
	endpoint string
	err      error
	skip     string
	sockets  []string // its gRPC sockets, which it makes in /tmp whatever TMPDIR says
}

func weedBinary() string {
	if p := os.Getenv("SANDLOOP_WEED"); p != "" {
		return p
	}
	p, _ := filepath.Abs("testdata/weed/bin/weed")
	return p
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func startWeed() {
	bin := weedBinary()
	if _, err := os.Stat(bin); err != nil {
		weed.skip = fmt.Sprintf("no SeaweedFS binary at %s: run `make weed` (make test and make test-s3 do) to build it from internal/snapshot/testdata/weed", bin)
		return
	}
	dir, err := os.MkdirTemp("", "sandloop-weed-")
	if err != nil {
		weed.err = err
		return
	}
	weed.dir = dir
	p, err := freePorts(8)
	if err != nil {
		weed.err = err
		return
	}
	cmd := exec.Command(bin, "server",
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir="+dir,
		fmt.Sprintf("-master.port=%d", p[0]), fmt.Sprintf("-master.port.grpc=%d", p[1]),
		fmt.Sprintf("-volume.port=%d", p[2]), fmt.Sprintf("-volume.port.grpc=%d", p[3]),
		"-filer", fmt.Sprintf("-filer.port=%d", p[4]), fmt.Sprintf("-filer.port.grpc=%d", p[5]),
		"-s3", fmt.Sprintf("-s3.port=%d", p[6]), fmt.Sprintf("-s3.port.grpc=%d", p[7]),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=32",
		"-filer.localSocket="+filepath.Join(dir, "filer.sock"))
	weed.sockets = weedSockets(p[1], p[3], p[5], p[7])
	// TMPDIR: its logs (glog's) and its filer's sockets go in its own
	// directory, removed with it, not in the host's /tmp.
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+weedKey, "AWS_SECRET_ACCESS_KEY="+weedSecret, "TMPDIR="+dir)
	log, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		weed.err = err
		return
	}
	cmd.Stdout, cmd.Stderr = log, log
	diesWithParent(cmd)
	if err := cmd.Start(); err != nil {
		weed.err = err
		return
	}
	weed.cmd = cmd
	weed.endpoint = fmt.Sprintf("127.0.0.1:%d", p[6])
	// Ready when a bucket can be made and an object written (the volume
	// server registers with the master a moment after the S3 port opens).
	deadline := time.Now().Add(90 * time.Second)
	for {
		err = probeWeed()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			b, _ := os.ReadFile(filepath.Join(dir, "weed.log"))
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			weed.err = fmt.Errorf("SeaweedFS did not become ready: %v\n%s", err, b)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func probeWeed() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := NewS3(ctx, S3Options{Endpoint: weed.endpoint, Bucket: weedBucket, Prefix: "probe/", AccessKey: weedKey, SecretKey: weedSecret, Insecure: true})
	if err != nil {
		return err
	}
	return b.Put(ctx, "ready", []byte("ok"))
}

func stopWeed() {
	if weed.cmd != nil {
		weed.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { weed.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			weed.cmd.Process.Kill()
			<-done
		}
	}
	if weed.dir != "" {
		os.RemoveAll(weed.dir)
	}
	for _, s := range weed.sockets {
		os.Remove(s)
	}
}

// weedSockets are the sockets weed server makes for its master's,
// volume's, filer's and S3's gRPC ports, in /tmp (no flag moves them).
func weedSockets(master, volume, filer, s3 int) []string {
	var out []string
	for _, s := range []struct {
		name string
		port int
	}{{"master", master}, {"volume", volume}, {"filer", filer}, {"s3", s3}} {
		out = append(out, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", s.name, s.port))
	}
	return out
}

// openS3 gives each test a key prefix of its own in the one bucket.
func openS3(t *testing.T) (Backend, []string) {
	weed.once.Do(startWeed)
	if weed.skip != "" {
		if os.Getenv("SANDLOOP_REQUIRE_S3") != "" {
			t.Fatal(weed.skip)
		}
		t.Skip(weed.skip)
	}
	if weed.err != nil {
		t.Fatal(weed.err)
	}
	prefix := "t-" + strings.ToLower(rand.Text()[:10]) + "/"
	env := []string{"SNAPSHOT_TEST_S3=" + weed.endpoint, "SNAPSHOT_TEST_S3_PREFIX=" + prefix}
	b, err := openS3Prefix(weed.endpoint, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return b, env
}

func openS3Prefix(endpoint, prefix string) (*S3, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return NewS3(ctx, S3Options{Endpoint: endpoint, Bucket: weedBucket, Prefix: prefix, AccessKey: weedKey, SecretKey: weedSecret, Insecure: true,
		Transport: &http.Transport{MaxIdleConnsPerHost: 16}})
}

// openFromEnv opens, in a child process, the backend of the parent's test.
func openFromEnv() (Backend, error) {
	if d := os.Getenv("SNAPSHOT_TEST_DIR"); d != "" {
		return NewDir(d)
	}
	return openS3Prefix(os.Getenv("SNAPSHOT_TEST_S3"), os.Getenv("SNAPSHOT_TEST_S3_PREFIX"))
}

func TestParseS3URL(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "envkey")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	for _, tc := range []struct {
		in   string
		want S3Options
		bad  string
	}{
		{in: "s3://127.0.0.1:8333/snaps?insecure=1", want: S3Options{Endpoint: "127.0.0.1:8333", Bucket: "snaps", Insecure: true, AccessKey: "envkey", SecretKey: "envsecret"}},
		{in: "s3://ak:sk@s3.example.com/b/cell-a?region=eu-west-1", want: S3Options{Endpoint: "s3.example.com", Bucket: "b", Prefix: "cell-a/", Region: "eu-west-1", AccessKey: "ak", SecretKey: "sk"}},
		{in: "s3://ak:topsecret@host", bad: "names no bucket"},
		{in: "s3://host/b?insecure=maybe", bad: "insecure= takes 1 or 0"},
	} {
		got, err := ParseS3URL(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) || strings.Contains(err.Error(), "topsecret") {
				t.Errorf("%s: %v, want an error saying %q (and no secret)", tc.in, err, tc.bad)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
