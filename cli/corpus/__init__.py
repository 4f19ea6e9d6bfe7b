"""Corpus files for ``suffixd warm``, on the client's side of the wire: ``units`` walks a
folder, hashes files and splits them into units (SQL statements, paragraphs, workload
turns, JSONL lines); ``watch`` follows the folder (watchdog) and debounces its changes.
Pure Python, no gRPC and no tokenizer: the daemon tokenizes what it receives.
"""
