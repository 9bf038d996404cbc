// Package blob stores the blobs accounts upload (images, video) and keeps
// them in step with the records that refer to them.
//
// Objects live behind Store, a small content-addressed interface with two
// implementations: DiskStore (the default, under the data directory, written
// with an atomic link into place) and S3Store (any S3-compatible service,
// through aws-sdk-go-v2). An object's key is its CID, so the same bytes
// uploaded by two accounts are stored once.
//
// Service is the domain layer over a Store and Postgres:
//
//   - Upload streams a body into storage while hashing it (sha256, raw-codec
//     CIDv1, bafkrei…), refuses bodies over the size limit before anything is
//     kept, and sniffs the MIME type from the bytes rather than trusting the
//     client.
//   - TrackTx implements repo.BlobTracker: inside every commit's transaction
//     it records which record refers to which blob, refuses a reference to a
//     blob the account never uploaded (ErrBlobNotFound), makes referenced
//     blobs permanent, and starts the expiry clock on a blob whose last
//     reference went.
//   - Run collects garbage: blobs left unreferenced for longer than the
//     expiry are deleted, and their object too once no account holds it.
//
// Object deletion and the upload of the same bytes by another account are
// serialised by a Postgres advisory lock on the CID, so a collector on one
// node never deletes an object another node has just uploaded again.
package blob
