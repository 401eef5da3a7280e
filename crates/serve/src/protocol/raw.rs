//! A request's JSON as read, before any check: the fields both readers produce — serde's (in
//! [`super::request`]) and the single-pass one ([`super::fast_json`]) — and the request
//! parser then validates.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::tensor::JsonData;

/// A request's JSON as read (see the module docs).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct RawRequest {
    #[serde(default)]
    pub(super) id: Option<Value>,
    #[serde(default)]
    pub(super) parameters: Option<Map<String, Value>>,
    pub(super) inputs: Vec<RawInput>,
    #[serde(default)]
    pub(super) outputs: Option<Vec<RawOutput>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct RawInput {
    pub(super) name: String,
    pub(super) shape: Vec<i64>,
    pub(super) datatype: String,
    #[serde(default)]
    pub(super) parameters: Option<Map<String, Value>>,
    #[serde(default)]
    pub(super) data: Option<JsonData>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct RawOutput {
    pub(super) name: String,
    #[serde(default)]
    pub(super) parameters: Option<Map<String, Value>>,
}
