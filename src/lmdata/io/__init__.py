"""Bytes from and to disk and object storage: the floor every other package stands on.

    location.py       one type for local paths and s3:// objects (``Location``, ``location``, ``glob``)
    s3.py             the S3 filesystem from the AWS environment, Lance's options, one-line errors
    streams.py        input streams decompressed once (.gz, .zst) and their read errors
    ranges.py         ranged reads of remote files, coalesced and in flight, with a pluggable check
    cache.py          the local cache root (LMDATA_CACHE_DIR) and the byte cache of remote chunks
    atomic.py         durable local writes (tmp + fsync + rename) and the full-disk error
    mapped.py         read-only file mappings that hold no file descriptor
    process_local.py  state built once per process (never pickled, rebuilt after fork)

Imports nothing of lmdata but ``errors``; pyarrow loads only when a remote path is used.
"""
