"""The benchmark library behind `suffixd bench` and the scripts in bench/, with no click in
it (cli/bench*.py are the command line over it; tests/test_import_layers.py keeps it so):

* ``errors``: ``BenchError``, why a benchmark cannot run, which the command line prints.
"""
