package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandloop/sandloop/client"
	"github.com/sandloop/sandloop/internal/snapshot"
	"github.com/sandloop/sandloop/internal/testutil"
)

// startWeed starts a real S3 server (SeaweedFS, built by `make weed` into
// internal/snapshot/testdata/weed/bin) on loopback for one test and
// returns its endpoint; without the binary the test skips, saying so.
func startWeed(t *testing.T, key, secret string) string {
	t.Helper()
	bin, _ := filepath.Abs("../../internal/snapshot/testdata/weed/bin/weed")
	if p := os.Getenv("SANDLOOP_WEED"); p != "" {
		bin = p
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no SeaweedFS binary at %s: run `make weed`", bin)
	}
	var ports []int
	var ls []net.Listener
	for range 8 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir="+dir,
		fmt.Sprintf("-master.port=%d", ports[0]), fmt.Sprintf("-master.port.grpc=%d", ports[1]),
		fmt.Sprintf("-volume.port=%d", ports[2]), fmt.Sprintf("-volume.port.grpc=%d", ports[3]),
		"-filer", fmt.Sprintf("-filer.port=%d", ports[4]), fmt.Sprintf("-filer.port.grpc=%d", ports[5]),
		"-s3", fmt.Sprintf("-s3.port=%d", ports[6]), fmt.Sprintf("-s3.port.grpc=%d", ports[7]),
		"-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-master.volumeSizeLimitMB=64", "-volume.max=32",
		"-filer.localSocket="+filepath.Join(dir, "filer.sock"))
	// TMPDIR: its logs (glog's) and its filer's sockets go in its own
	// directory, removed with it, not in the host's /tmp.
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+key, "AWS_SECRET_ACCESS_KEY="+secret, "TMPDIR="+dir)
	log, err := os.Create(filepath.Join(dir, "weed.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // gone with the test binary
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Its gRPC sockets: in /tmp whatever TMPDIR says (no flag moves them).
		for i, name := range []string{"master", "volume", "filer", "s3"} {
			defer os.Remove(fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", name, ports[2*i+1]))
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	endpoint := fmt.Sprintf("127.0.0.1:%d", ports[6])
	// Ready when a bucket can be made and an object written.
	testutil.WaitFor(t, 90*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		b, err := snapshot.NewS3(ctx, snapshot.S3Options{Endpoint: endpoint, Bucket: "probe", AccessKey: key, SecretKey: secret, Insecure: true})
		if err != nil {
			return err
		}
		return b.Put(ctx, "ready", []byte("ok"))
	})
	return endpoint
}

// Two serve processes (two hosts of a cell) on one S3 bucket: a snapshot
// taken on one is listed and restored on the other, files exact and
// variables back; a session hibernated to S3 wakes on its next request.
func TestSnapshotsS3AcrossHosts(t *testing.T) {
	const token = "s3-token-aaaaaaaaaaaaaa"
	const key, secret = "sandloop-test", "sandloop-test-secret"
	endpoint := startWeed(t, key, secret)
	t.Setenv("AWS_ACCESS_KEY_ID", key)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	store := "s3://" + endpoint + "/cell/snaps?insecure=1"
	_, env1, _ := startServeCmd(t, "--pool", "0", "--token", token, "--snapshot-store", store)
	_, env2, _ := startServeCmd(t, "--pool", "0", "--token", token, "--snapshot-store", store)
	ctx := context.Background()
	c1, _ := client.New(env1.URL, &client.Options{Token: token})
	c2, _ := client.New(env2.URL, &client.Options{Token: token})
	s, err := c1.CreateSession(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c1.Execute(ctx, s.ID, "import os\nos.makedirs('d', exist_ok=True)\nopen('d/a.bin','wb').write(os.urandom(3 << 20))\nimport hashlib\nh = hashlib.sha256(open('d/a.bin','rb').read()).hexdigest()", nil); err != nil || r.Status != "ok" {
		t.Fatalf("%+v %v", r, err)
	}
	sn, err := c1.Snapshot(ctx, s.ID, "cell")
	if err != nil {
		t.Fatal(err)
	}
	list, err := c2.Snapshots(ctx, "")
	if err != nil || len(list) != 1 || list[0].ID != sn.ID {
		t.Fatalf("the other host lists %+v %v; want %s", list, err, sn.ID)
	}
	n, err := c2.RestoreSnapshot(ctx, sn.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c2.Execute(ctx, n.ID, "hashlib.sha256(open('d/a.bin','rb').read()).hexdigest() == h", nil); err != nil || r.Text() != "True" {
		t.Errorf("restored on the other host: %+v %v", r, err)
	}
	if h, err := c1.Hibernate(ctx, s.ID); err != nil || h.State != "hibernated" {
		t.Fatalf("hibernate to S3: %+v %v", h, err)
	}
	if r, err := c1.Execute(ctx, s.ID, "len(open('d/a.bin','rb').read())", nil); err != nil || r.Text() != fmt.Sprint(3<<20) {
		t.Errorf("after the wake from S3: %+v %v", r, err)
	}
	if err := c2.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if list, err := c1.Snapshots(ctx, ""); err != nil || len(list) != 0 {
		t.Errorf("after the delete on the other host: %+v %v", list, err)
	}
}
