"""The store's names on disk (DESIGN.md "Store"): every module spells them through these.

    <store>/manifest.json       MANIFEST_NAME: written last; no manifest, no store
    <store>/ingest-plan.json    PLAN_NAME: what decides the store's bytes (resume checks it)
    <store>/.lock               LOCK_NAME: held by the ingest writing the store
    <store>/tokenizer/          TOKENIZER_DIR: a copy of the tokenizer used
    <store>/<split>/<format>/_shards/NNNNN.json   RECORD_DIR: a shard's completion record
    <store>/<split>/_provenance/                  PROVENANCE_DIR: each document's source (optional)
"""

MANIFEST_NAME = "manifest.json"
PLAN_NAME = "ingest-plan.json"
LOCK_NAME = ".lock"
TOKENIZER_DIR = "tokenizer"
RECORD_DIR = "_shards"
PROVENANCE_DIR = "_provenance"
