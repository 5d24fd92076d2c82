package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"

	// minio-go rather than the AWS SDK: one module with few dependencies
	// (the AWS SDK v2 is a dozen modules), and it is written for every
	// S3-compatible server (AWS, MinIO, SeaweedFS, Ceph RGW, R2, GCS's
	// XML API), path-style addressing included, which self-hosted cells use.
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Options locate a bucket of S3-compatible object storage.
type S3Options struct {
	Endpoint  string // host:port, e.g. "s3.amazonaws.com" or "127.0.0.1:8333"
	Bucket    string // created if missing
	Prefix    string // optional key prefix, e.g. "cell-a/"; "" for none
	AccessKey string
	SecretKey string
	Region    string // optional
	Insecure  bool   // plain HTTP (a server on loopback)
	// Transport, if set, carries the requests (tests, custom CAs).
	Transport http.RoundTripper
}

// S3 is the object storage backend. Each object is one PUT (objects are
// at most a few MiB, so never a multipart upload): S3 makes an object
// visible whole or not at all, which is the atomicity Backend asks for.
type S3 struct {
	c      *minio.Client
	bucket string
	prefix string
}

// NewS3 connects to the bucket, creating it if it does not exist.
func NewS3(ctx context.Context, o S3Options) (*S3, error) {
	if o.Endpoint == "" || o.Bucket == "" {
		return nil, &ArgumentError{"s3", errors.New("an endpoint and a bucket are required")}
	}
	c, err := minio.New(o.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(o.AccessKey, o.SecretKey, ""),
		Secure:       !o.Insecure,
		Region:       o.Region,
		Transport:    o.Transport,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, &ArgumentError{"s3", err}
	}
	ok, err := c.BucketExists(ctx, o.Bucket)
	if err != nil {
		return nil, fmt.Errorf("snapshot storage: bucket %s at %s: %w", o.Bucket, o.Endpoint, err)
	}
	if !ok {
		if err := c.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{Region: o.Region}); err != nil {
			return nil, fmt.Errorf("snapshot storage: create bucket %s: %w", o.Bucket, err)
		}
	}
	return &S3{c: c, bucket: o.Bucket, prefix: o.Prefix}, nil
}

func notExist(err error) error {
	if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
		return fmt.Errorf("%w (%v)", fs.ErrNotExist, err)
	}
	return err
}

func (s *S3) Put(ctx context.Context, key string, data []byte) error {
	_, err := s.c.PutObject(ctx, s.bucket, s.prefix+key, bytes.NewReader(data), int64(len(data)),
		minio.PutObjectOptions{DisableMultipart: true, SendContentMd5: true, ContentType: "application/octet-stream"})
	if err != nil {
		return fmt.Errorf("snapshot storage: put %s: %w", key, err)
	}
	return nil
}

func (s *S3) Get(ctx context.Context, key string, maxBytes int64) ([]byte, error) {
	o, err := s.c.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("snapshot storage: get %s: %w", key, notExist(err))
	}
	defer o.Close()
	b, err := io.ReadAll(io.LimitReader(o, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("snapshot storage: get %s: %w", key, notExist(err))
	}
	if int64(len(b)) > maxBytes {
		return nil, fmt.Errorf("snapshot storage: %s is more than the %d bytes expected", key, maxBytes)
	}
	return b, nil
}

func (s *S3) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	i, err := s.c.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("snapshot storage: stat %s: %w", key, notExist(err))
	}
	return ObjectInfo{Key: key, Size: i.Size, ModTime: i.LastModified}, nil
}

func (s *S3) Delete(ctx context.Context, key string) error {
	if err := s.c.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{}); err != nil && !errors.Is(notExist(err), fs.ErrNotExist) {
		return fmt.Errorf("snapshot storage: delete %s: %w", key, err)
	}
	return nil
}

func (s *S3) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine if fn ends early
	for o := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return fmt.Errorf("snapshot storage: list %s: %w", prefix, o.Err)
		}
		if err := fn(ObjectInfo{Key: strings.TrimPrefix(o.Key, s.prefix), Size: o.Size, ModTime: o.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// OpenBackend opens the storage spec names: a directory path, or
// s3://[ACCESS:SECRET@]HOST[:PORT]/BUCKET[/PREFIX][?insecure=1&region=R]
// (keys left out of the URL are read from AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY; insecure=1 is plain HTTP, for a server on
// loopback or a private network).
func OpenBackend(ctx context.Context, spec string) (Backend, error) {
	if !strings.HasPrefix(spec, "s3://") {
		if spec == "" {
			return nil, &ArgumentError{"snapshot store", errors.New("is empty: give a directory or s3://HOST/BUCKET")}
		}
		return NewDir(spec)
	}
	o, err := ParseS3URL(spec)
	if err != nil {
		return nil, err
	}
	return NewS3(ctx, o)
}

// ParseS3URL reads OpenBackend's s3:// form.
func ParseS3URL(spec string) (S3Options, error) {
	u, err := url.Parse(spec)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return S3Options{}, &ArgumentError{"snapshot store", fmt.Errorf("%q: want s3://[ACCESS:SECRET@]HOST[:PORT]/BUCKET[/PREFIX][?insecure=1&region=R]", redact(spec))}
	}
	bucket, prefix, _ := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if bucket == "" {
		return S3Options{}, &ArgumentError{"snapshot store", fmt.Errorf("%q names no bucket: want s3://HOST[:PORT]/BUCKET[/PREFIX]", redact(spec))}
	}
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	o := S3Options{Endpoint: u.Host, Bucket: bucket, Prefix: prefix, Region: u.Query().Get("region"),
		AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY")}
	switch u.Query().Get("insecure") {
	case "", "0", "false":
	case "1", "true":
		o.Insecure = true
	default:
		return S3Options{}, &ArgumentError{"snapshot store", errors.New("insecure= takes 1 or 0")}
	}
	if u.User != nil {
		o.AccessKey = u.User.Username()
		o.SecretKey, _ = u.User.Password()
	}
	return o, nil
}

// redact hides a URL's secret key from messages.
func redact(spec string) string {
	u, err := url.Parse(spec)
	if err != nil || u.User == nil {
		return spec
	}
	return u.Redacted()
}
