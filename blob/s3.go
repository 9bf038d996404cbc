package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// S3Config says where an S3Store keeps objects.
type S3Config struct {
	// Bucket holds the objects. Required.
	Bucket string
	// Endpoint is the service's base URL (https://s3.example.com); empty
	// means AWS itself.
	Endpoint string
	// Region is the bucket's region; S3-compatible services usually accept
	// any (default us-east-1).
	Region string
	// AccessKey and SecretKey are static credentials. Empty means the AWS
	// default chain (environment, shared files, instance role).
	AccessKey string
	// SecretKey goes with AccessKey.
	SecretKey string
	// Prefix is prepended to every object key, to share a bucket.
	Prefix string
	// PathStyle addresses the bucket as <endpoint>/<bucket> rather than
	// <bucket>.<endpoint>; most self-hosted services need it. It is forced
	// on when Endpoint is set.
	PathStyle bool
	// SpoolDir holds uploads while they are hashed (default os.TempDir()).
	SpoolDir string
}

// S3Store keeps objects in an S3-compatible bucket.
//
// An upload is spooled to a local file while it is hashed and only then
// sent, with its length known, under its CID: the key is unknown until the
// last byte, S3 has no rename (a copy of a 100 MB object costs another
// 100 MB of transfer), and a body that breaks the size limit or is cut off
// never reaches the bucket. Memory stays constant; disk use is one file per
// upload in flight.
type S3Store struct {
	client *s3.Client
	bucket string
	prefix string
	spool  string
}

// NewS3Store connects to the bucket described by cfg. It does not contact
// the service; the first request does.
func NewS3Store(ctx context.Context, cfg S3Config) (*S3Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("blob: S3 bucket not set")
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	opts := []func(*awsconfig.LoadOptions) error{awsconfig.WithRegion(cfg.Region)}
	if cfg.AccessKey != "" || cfg.SecretKey != "" {
		opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, "")))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("blob: S3 configuration: %w", err)
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			o.UsePathStyle = true
		}
		if cfg.PathStyle {
			o.UsePathStyle = true
		}
		// The SDK's default checksums (CRC32 trailers on every PUT) are
		// not understood by several S3-compatible services; ask for them
		// only where an operation requires them.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	spool := cfg.SpoolDir
	if spool == "" {
		spool = os.TempDir()
	}
	return &S3Store{client: client, bucket: cfg.Bucket, prefix: cfg.Prefix, spool: spool}, nil
}

func (s *S3Store) key(k string) *string { return aws.String(s.prefix + k) }

// isNotFound recognises the several ways S3 services say "no such key".
func isNotFound(err error) bool {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode() {
		case "NoSuchKey", "NotFound", "404":
			return true
		}
	}
	return false
}

// Create starts a spooled upload.
func (s *S3Store) Create(context.Context) (Writer, error) {
	f, err := os.CreateTemp(s.spool, "bulwark-blob-")
	if err != nil {
		return nil, fmt.Errorf("blob: creating spool file: %w", err)
	}
	return &s3Writer{store: s, f: f}, nil
}

// Open returns a reader that fetches the object lazily: one GET for a whole
// read, one ranged GET per seek elsewhere.
func (s *S3Store) Open(ctx context.Context, key string) (io.ReadSeekCloser, error) {
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: s.key(key)})
	if isNotFound(err) {
		return nil, fmt.Errorf("%w: %s", ErrObjectNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("blob: S3 get %s: %w", key, err)
	}
	size := aws.ToInt64(out.ContentLength)
	return &s3Reader{ctx: ctx, store: s, key: key, size: size, body: out.Body}, nil
}

// Stat returns the object's size.
func (s *S3Store) Stat(ctx context.Context, key string) (int64, error) {
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: s.key(key)})
	if isNotFound(err) {
		return 0, fmt.Errorf("%w: %s", ErrObjectNotFound, key)
	}
	if err != nil {
		return 0, fmt.Errorf("blob: S3 head %s: %w", key, err)
	}
	return aws.ToInt64(out.ContentLength), nil
}

// Delete removes the object.
func (s *S3Store) Delete(ctx context.Context, key string) error {
	_, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: s.key(key)})
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("blob: S3 delete %s: %w", key, err)
	}
	return nil
}

type s3Writer struct {
	store *S3Store
	f     *os.File
}

func (w *s3Writer) Write(p []byte) (int, error) { return w.f.Write(p) }

// Commit uploads the spooled bytes under key in one PUT.
func (w *s3Writer) Commit(ctx context.Context, key string) error {
	fi, err := w.f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	// A section reader is seekable (the SDK signs the payload, then
	// rewinds) and not a Closer (net/http would close our spool file).
	_, err = w.store.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        &w.store.bucket,
		Key:           w.store.key(key),
		Body:          io.NewSectionReader(w.f, 0, size),
		ContentLength: aws.Int64(size),
		ContentType:   aws.String("application/octet-stream"),
	})
	if err != nil {
		return fmt.Errorf("blob: S3 put %s: %w", key, err)
	}
	return nil
}

func (w *s3Writer) Close() error {
	err := w.f.Close()
	if rmErr := os.Remove(w.f.Name()); rmErr != nil && err == nil {
		err = rmErr
	}
	return err
}

// s3Reader is a seekable view of one object. Seeking only moves the offset;
// the next Read opens a ranged GET from there if the open body is elsewhere.
type s3Reader struct {
	ctx     context.Context
	store   *S3Store
	key     string
	size    int64
	off     int64 // position the caller sees
	bodyOff int64 // position of body, when body != nil
	body    io.ReadCloser
}

func (r *s3Reader) Read(p []byte) (int, error) {
	if r.off >= r.size {
		return 0, io.EOF
	}
	if r.body != nil && r.bodyOff != r.off {
		_ = r.body.Close()
		r.body = nil
	}
	if r.body == nil {
		out, err := r.store.client.GetObject(r.ctx, &s3.GetObjectInput{
			Bucket: &r.store.bucket,
			Key:    r.store.key(r.key),
			Range:  aws.String(fmt.Sprintf("bytes=%d-", r.off)),
		})
		if err != nil {
			return 0, fmt.Errorf("blob: S3 get %s at %d: %w", r.key, r.off, err)
		}
		r.body, r.bodyOff = out.Body, r.off
	}
	n, err := r.body.Read(p)
	r.off += int64(n)
	r.bodyOff += int64(n)
	if err == io.EOF && r.off < r.size {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (r *s3Reader) Seek(offset int64, whence int) (int64, error) {
	var abs int64
	switch whence {
	case io.SeekStart:
		abs = offset
	case io.SeekCurrent:
		abs = r.off + offset
	case io.SeekEnd:
		abs = r.size + offset
	default:
		return 0, errors.New("blob: invalid whence")
	}
	if abs < 0 {
		return 0, errors.New("blob: negative position")
	}
	r.off = abs
	return abs, nil
}

func (r *s3Reader) Close() error {
	if r.body == nil {
		return nil
	}
	err := r.body.Close()
	r.body = nil
	return err
}
