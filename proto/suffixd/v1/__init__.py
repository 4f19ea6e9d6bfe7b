"""Generated gRPC code for the suffixd.v1 wire contract (see suffixd.proto).

The *_pb2*.py files are generated with grpc_tools.protoc and checked in;
tests/test_proto_drift.py regenerates them and fails if they differ.
"""
