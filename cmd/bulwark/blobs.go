package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/bulwark-pds/bulwark/blob"
	"github.com/bulwark-pds/bulwark/config"
)

// newBlobService builds the blob service on the configured store: the S3
// bucket when --blob-s3-bucket is set, else the disk under --blob-dir.
func newBlobService(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger) (*blob.Service, error) {
	var store blob.Store
	if cfg.BlobS3Bucket != "" {
		s3, err := blob.NewS3Store(ctx, blob.S3Config{
			Bucket:    cfg.BlobS3Bucket,
			Endpoint:  cfg.BlobS3Endpoint,
			Region:    cfg.BlobS3Region,
			AccessKey: cfg.BlobS3AccessKey,
			SecretKey: cfg.BlobS3SecretKey,
		})
		if err != nil {
			return nil, err
		}
		store = s3
		logger.Info("blobs in S3", "bucket", cfg.BlobS3Bucket, "endpoint", cfg.BlobS3Endpoint)
	} else {
		disk, err := blob.NewDiskStore(cfg.BlobDir)
		if err != nil {
			return nil, err
		}
		store = disk
		logger.Info("blobs on disk", "dir", cfg.BlobDir)
	}
	return blob.New(pool, store, blob.Config{MaxBytes: cfg.BlobMaxBytes, TempTTL: cfg.BlobTempTTL, Logger: logger}), nil
}
