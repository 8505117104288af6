"""Ingestion: vLLM and TGI logs and request traces become RequestRecords, metrics and windows."""
