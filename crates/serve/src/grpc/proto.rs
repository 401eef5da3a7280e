//! The generated messages, server and client of `proto/grpc_predict_v2.proto` (compiled by
//! `build.rs` with a vendored `protoc`; their codec is [`Codec`](super::Codec)).

#![allow(missing_docs, clippy::all, clippy::pedantic)]

tonic::include_proto!("inference");
