package backup

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ExtractTar unpacks a backup written by ToTar into dir. Only the names a
// backup holds are accepted (the manifest, the dump, secrets/<name>,
// blobs/<xx>/<cid>), so a stream cannot write outside dir; files are
// created 0600, directories 0700.
func ExtractTar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	seen := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: reading the tar stream: %v", ErrCorrupt, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			continue
		}
		name := strings.TrimPrefix(hdr.Name, "./")
		if hdr.Typeflag != tar.TypeReg || !allowedTarName(name) || seen[name] {
			return fmt.Errorf("%w: unexpected entry %q in the tar stream", ErrCorrupt, hdr.Name)
		}
		seen[name] = true
		if name == ManifestFile && hdr.Size > maxManifestBytes {
			return fmt.Errorf("%w: %s is %d bytes", ErrCorrupt, ManifestFile, hdr.Size)
		}
		if err := extractFile(tr, filepath.Join(dir, filepath.FromSlash(name)), hdr.Size); err != nil {
			return err
		}
	}
	if !seen[ManifestFile] {
		return fmt.Errorf("%w: the tar stream has no %s (cut short?)", ErrCorrupt, ManifestFile)
	}
	return nil
}

func extractFile(r io.Reader, p string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%w: %s: %d of %d bytes", ErrCorrupt, p, n, size)
	}
	return nil
}

// allowedTarName reports whether a tar entry belongs in a backup, by the
// names ToTar writes.
func allowedTarName(name string) bool {
	parts := strings.Split(name, "/")
	switch {
	case name == ManifestFile || name == DatabaseFile:
		return true
	case len(parts) == 2 && parts[0] == SecretsDir:
		return safeName(parts[1])
	case len(parts) == 3 && parts[0] == BlobsDir:
		return blobKeyValid(parts[1], parts[2])
	}
	return false
}
