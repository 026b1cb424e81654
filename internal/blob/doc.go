// Package blob owns content-addressed storage of large immutable blobs, in
// practice the zstd tar layers of sandbox filesystem snapshots (tens of MiB
// to several GiB).
//
// A blob's key is the lowercase hex SHA-256 of its content. A Store computes
// the key itself while the content streams in, so:
//
//   - a blob is never held in memory whole: Put streams through a hash into
//     its destination;
//   - a blob is never visible under its key before it is complete and
//     durable, and never visible under a key that is not its hash: content is
//     written somewhere private first and published (renamed, or uploaded
//     under its final name) only after the hash is known;
//   - putting the same content twice stores it once, and concurrent Puts of
//     the same content are safe;
//   - every key that crosses the API is checked against the 64-lowercase-hex
//     form before use, so a key can never name a path or object outside the
//     store;
//   - Get verifies what it reads: a reader that reaches the end of a blob
//     whose bytes no longer hash to its key (corruption at rest) fails
//     instead of returning io.EOF.
//
// Two backends implement Store: Local, a directory on this node, and S3, any
// S3-compatible object store. Open picks one from a URL:
//
//	""                       Local in <data-dir>/blobs
//	file://                  Local in <data-dir>/blobs
//	file:///abs/dir          Local in /abs/dir
//	s3://[ACCESS:SECRET@]host[:port]/bucket[/prefix][?region=R&tls=BOOL&spool=DIR]
//
// For s3:// URLs:
//
//   - host[:port] is the endpoint; the bucket is always addressed path-style
//     (http://host/bucket/key), which every S3-compatible server accepts;
//   - the bucket is created when it does not exist;
//   - prefix, when given, is prepended to every object name (a trailing
//     slash is added), so one bucket can hold several stores;
//   - region defaults to us-east-1;
//   - tls defaults to true; tls=false speaks plain HTTP (for a server on
//     loopback or a private network);
//   - spool is the directory where Put stages content while hashing it
//     (default <data-dir>/blobs-spool, or the system temp dir without a
//     data dir);
//   - credentials come from the URL's user info (percent-encode reserved
//     characters), else from the environment variables SANDBOXD_S3_ACCESS_KEY
//     and SANDBOXD_S3_SECRET_KEY; keeping them out of the URL keeps them out
//     of process listings and logs.
//
// Blobs in S3 are stored as <prefix><key>. Put on S3 spools the content to a
// local temporary file while hashing it, then uploads it under its final
// name with its size known (parallel multipart for large blobs), skipping the
// upload when the key is already stored. An incomplete multipart upload is
// invisible in S3, so a crash leaves no partial object; configure the
// bucket's lifecycle to abort incomplete uploads after a day to reclaim their
// space.
//
// Cache wraps a store that several nodes share (S3) with a bounded
// read-through cache in a local directory: a blob read once is read from
// local disk afterwards, until it is the least recently used when room is
// needed. Only a blob read to its verified end is kept, and concurrent reads
// of a blob not yet cached download it once. Writes go to the backing store.
package blob
