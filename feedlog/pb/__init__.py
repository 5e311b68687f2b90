"""Generated protobuf modules (tools/gen_proto.py). Do not edit."""
