"""Generated protobuf code for couler.v1 (scripts/gen_proto.sh); do not edit."""
