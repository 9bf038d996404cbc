package blob

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/jackc/pgx/v5"

	"github.com/bulwark-pds/bulwark/db"
)

// Upload stores r's bytes as a temporary blob of did: it becomes permanent
// when a record refers to it, and is deleted after TempTTL otherwise. The
// bytes are hashed while they stream to storage; a body over MaxBytes is a
// *TooLargeError and leaves nothing behind. The MIME type is sniffed from
// the bytes (see Receive for when declared, the client's Content-Type,
// counts). It is Receive then Received.Store.
func (s *Service) Upload(ctx context.Context, did syntax.DID, r io.Reader, declared string) (*Blob, error) {
	rcv, err := s.Receive(ctx, r, declared)
	if err != nil {
		return nil, err
	}
	defer rcv.Close()
	return rcv.Store(ctx, did)
}

// Received is an upload whose bytes have all arrived and been hashed, held
// in the store's scratch space: Store records it, Close discards what was
// not stored. The two steps are apart so that a caller can treat them
// differently: receiving takes as long as the client sends, storing is the
// server's own work.
type Received struct {
	s    *Service
	w    Writer
	blob Blob
}

// Blob describes the received bytes (CID, sniffed MIME type, size).
func (rc *Received) Blob() Blob { return rc.blob }

// Receive reads r to its end into scratch space, hashing it and sniffing
// its MIME type. A body over MaxBytes is a *TooLargeError; one that cannot
// be read to its end wraps ErrUploadRead. On error nothing is kept.
//
// The stored type is what the bytes are, not what the client says: a
// client's Content-Type is not trusted where the bytes say otherwise,
// since the blob is served back under the stored type. Where the sniffer
// recognises nothing (no signature it knows: application/octet-stream, or
// plain text) the declared type is kept, as the reference PDS keeps it
// when its sniffer finds nothing: QuickTime, HEIC or AVIF bytes stay
// what the app says they are, and a record can refer to them by that
// type (Service.TrackTx compares the two). A declared type must be a bare
// type/subtype of at most maxDeclaredType bytes; anything else is ignored.
func (s *Service) Receive(ctx context.Context, r io.Reader, declared string) (*Received, error) {
	w, err := s.store.Create(ctx)
	if err != nil {
		return nil, err
	}
	rc := &Received{s: s, w: w}
	if err := rc.read(r); err != nil {
		rc.Close()
		return nil, err
	}
	rc.blob.MimeType = storedType(rc.blob.MimeType, declared)
	return rc, nil
}

func (rc *Received) read(r io.Reader) error {
	h := sha256.New()
	head := make([]byte, 0, sniffLen)
	bufp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bufp)
	buf := *bufp
	var size int64
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			size += int64(n)
			if size > rc.s.cfg.MaxBytes {
				return &TooLargeError{Max: rc.s.cfg.MaxBytes}
			}
			if len(head) < sniffLen {
				head = append(head, buf[:min(n, sniffLen-len(head))]...)
			}
			h.Write(buf[:n])
			if _, err := rc.w.Write(buf[:n]); err != nil {
				return fmt.Errorf("writing blob: %w", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("%w after %d bytes: %w", ErrUploadRead, size, rerr)
		}
	}
	c, err := cidFromSHA256(h.Sum(nil))
	if err != nil {
		return err
	}
	rc.blob = Blob{CID: c, MimeType: http.DetectContentType(head), Size: size}
	return nil
}

// Store records the received bytes as a temporary blob of did.
func (rc *Received) Store(ctx context.Context, did syntax.DID) (*Blob, error) {
	s, b := rc.s, rc.blob
	key := b.CID.String()
	// Store the object outside any transaction (an S3 PUT can take a
	// while), then record it under the CID's lock. A collector may have
	// deleted the object between the two (another account's expired copy
	// of the same bytes): Stat under the lock sees that, and the object
	// is written again.
	if err := rc.w.Commit(ctx, key); err != nil {
		return nil, err
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, qLockCID, key); err != nil {
			return db.Translate(err)
		}
		if _, err := s.store.Stat(ctx, key); errors.Is(err, ErrObjectNotFound) {
			if err := rc.w.Commit(ctx, key); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		_, err := tx.Exec(ctx, qInsertBlob, did.String(), key, b.MimeType, b.Size, key)
		return db.Translate(err)
	})
	if err != nil {
		return nil, fmt.Errorf("recording blob: %w", err)
	}
	s.log.Debug("blob uploaded", "did", did, "cid", key, "size", b.Size, "mime", b.MimeType)
	return &b, nil
}

// Close releases the scratch space; bytes never stored are discarded.
// Safe to call more than once.
func (rc *Received) Close() error {
	if rc.w == nil {
		return nil
	}
	err := rc.w.Close()
	rc.w = nil
	if err != nil {
		rc.s.log.Warn("discarding upload scratch file", "cid", rc.blob.CID, "error", err)
	}
	return err
}

// maxDeclaredType bounds the declared type a blob may be stored under.
const maxDeclaredType = 100

// storedType is the type a blob is stored under: sniffed, unless the
// sniffer recognised nothing and the client declared a well-formed type.
func storedType(sniffed, declared string) string {
	if sniffed != "application/octet-stream" && sniffed != "text/plain; charset=utf-8" {
		return sniffed
	}
	base, _, _ := strings.Cut(declared, ";")
	base = strings.ToLower(strings.TrimSpace(base))
	if len(base) > maxDeclaredType {
		return sniffed
	}
	typ, sub, ok := strings.Cut(base, "/")
	if !ok || !isToken(typ) || !isToken(sub) {
		return sniffed
	}
	return base
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
