//! The RPC transport shared by protocol/client and protocol/server (being written).
