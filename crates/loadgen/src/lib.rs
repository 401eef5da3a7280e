//! kiln's client side of the serving tier, kept out of the server: a small loopback HTTP
//! client ([`client`]), the load generator over HTTP and gRPC ([`loadtest`]), and the serving
//! latency benchmark behind `kiln bench serve` ([`bench`]).

#![warn(missing_docs)]

pub mod bench;
pub mod client;
pub mod loadtest;

// The library core's helpers, under the name this crate's files use.
use kiln_model::util;
