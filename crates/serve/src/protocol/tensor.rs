//! A request's input tensors: JSON `data` flattened while it is parsed, or a slice of the
//! binary part of the body, and the typed decoders the model layer reads them with.

use std::fmt;

use axum::body::Bytes;
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use super::{Datatype, ProtocolError, err};

/// JSON tensor data flattened in row-major order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JsonData {
    /// The values (booleans as 0/1).
    pub values: Vec<f64>,
    /// Whether any element was a boolean.
    pub has_bool: bool,
    /// Whether any element was a number.
    pub has_number: bool,
    /// String elements (a BYTES tensor's), in order.
    pub strings: Vec<String>,
}

impl JsonData {
    /// Element count (numbers, booleans and strings).
    pub fn len(&self) -> usize {
        self.values.len() + self.strings.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'de> Deserialize<'de> for JsonData {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Flatten<'a>(&'a mut JsonData);
        impl<'de> de::DeserializeSeed<'de> for Flatten<'_> {
            type Value = ();
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(self)
            }
        }
        impl<'de> Visitor<'de> for Flatten<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("numbers, booleans or strings, flat or in nested arrays")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                if let Some(n) = seq.size_hint() {
                    self.0.values.reserve(n);
                }
                while seq.next_element_seed(Flatten(&mut *self.0))?.is_some() {}
                Ok(())
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
                self.0.has_number = true;
                self.0.values.push(v);
                Ok(())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
                self.visit_f64(v as f64)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
                self.0.has_bool = true;
                self.0.values.push(if v { 1.0 } else { 0.0 });
                Ok(())
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
                self.0.strings.push(v.to_string());
                Ok(())
            }
            fn visit_unit<E: de::Error>(self) -> Result<(), E> {
                Err(E::custom("null is not a tensor element; send numbers"))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
                Err(de::Error::custom(
                    "an object is not a tensor element; send numbers in (nested) arrays",
                ))
            }
        }
        let mut out = JsonData::default();
        de::DeserializeSeed::deserialize(Flatten(&mut out), d)?;
        Ok(out)
    }
}

/// The data of one input tensor, not yet decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum InputData {
    /// From the JSON `data` field.
    Json(JsonData),
    /// Raw little-endian bytes from the binary part of the body.
    Binary(Bytes),
    /// A BYTES tensor's elements (UTF-8 text), from any of the encodings.
    Strings(Vec<String>),
}

/// A BYTES tensor's binary form — each element a 4-byte little-endian length, then that
/// many bytes — as `count` UTF-8 strings. `name` is the input's, for messages.
pub fn parse_bytes_elements(
    name: &str,
    b: &[u8],
    count: usize,
) -> Result<Vec<String>, ProtocolError> {
    let mut out = Vec::with_capacity(count.min(b.len() / 4));
    let mut at = 0usize;
    while at < b.len() {
        if b.len() - at < 4 {
            return err(format!(
                "input `{name}`: BYTES element {} has a truncated length prefix (each element is a 4-byte little-endian length, then its bytes)",
                out.len()
            ));
        }
        let n = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
        at += 4;
        if n > b.len() - at {
            return err(format!(
                "input `{name}`: BYTES element {} says {n} bytes but only {} remain",
                out.len(),
                b.len() - at
            ));
        }
        let s = std::str::from_utf8(&b[at..at + n]).map_err(|_| {
            ProtocolError(format!(
                "input `{name}`: BYTES element {} is not UTF-8 text",
                out.len()
            ))
        })?;
        out.push(s.to_string());
        at += n;
        if out.len() > count {
            break;
        }
    }
    if out.len() != count {
        return err(format!(
            "input `{name}` has {} BYTES elements but its shape needs {count}",
            out.len()
        ));
    }
    Ok(out)
}

/// One input tensor of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct InputTensor {
    /// Its name.
    pub name: String,
    /// Its declared datatype.
    pub datatype: Datatype,
    /// Its declared shape.
    pub shape: Vec<usize>,
    /// Its data, whose element count already matches the shape.
    pub data: InputData,
}

impl InputTensor {
    /// Element count.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn expect_type(&self, want: Datatype) -> Result<(), ProtocolError> {
        if self.datatype != want {
            return err(format!(
                "input `{}` has datatype {}; expected {want}",
                self.name, self.datatype
            ));
        }
        Ok(())
    }

    fn json_numbers(&self, d: &JsonData) -> Result<(), ProtocolError> {
        if !d.strings.is_empty() {
            return err(format!(
                "input `{}` of datatype {} has string elements; expected numbers",
                self.name, self.datatype
            ));
        }
        if d.has_bool {
            return err(format!(
                "input `{}` of datatype {} has boolean elements; expected numbers",
                self.name, self.datatype
            ));
        }
        Ok(())
    }

    fn non_finite(&self, i: usize, v: f64) -> ProtocolError {
        ProtocolError(format!(
            "input `{}` element {i} (row {}) is {v} after conversion to {}; expected a finite number",
            self.name,
            i / self.shape.last().copied().unwrap_or(1).max(1),
            self.datatype
        ))
    }

    fn not_strings(&self) -> ProtocolError {
        ProtocolError(format!(
            "input `{}` of datatype {} carries BYTES elements",
            self.name, self.datatype
        ))
    }

    /// Decode an FP32 tensor; every element must be finite.
    pub fn to_f32(&self) -> Result<Vec<f32>, ProtocolError> {
        let v = self.to_f32_with_nan()?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(self.non_finite(i, v[i] as f64));
        }
        Ok(v)
    }

    /// Decode an FP32 tensor whose NaN elements mean "missing" (a raw input column of a
    /// model that imputes it); ±∞ is refused.
    pub fn to_f32_with_nan(&self) -> Result<Vec<f32>, ProtocolError> {
        self.expect_type(Datatype::Fp32)?;
        let v: Vec<f32> = match &self.data {
            InputData::Json(d) => {
                self.json_numbers(d)?;
                d.values.iter().map(|&x| x as f32).collect()
            }
            InputData::Binary(b) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            InputData::Strings(_) => return Err(self.not_strings()),
        };
        if let Some(i) = v.iter().position(|x| x.is_infinite()) {
            return Err(self.non_finite(i, v[i] as f64));
        }
        Ok(v)
    }

    /// Decode a BYTES tensor as UTF-8 strings.
    pub fn to_strings(&self) -> Result<&[String], ProtocolError> {
        self.expect_type(Datatype::Bytes)?;
        match &self.data {
            InputData::Strings(s) => Ok(s),
            _ => err(format!(
                "input `{}` of datatype BYTES has no string elements",
                self.name
            )),
        }
    }

    /// Decode an FP64 tensor; every element must be finite.
    pub fn to_f64(&self) -> Result<Vec<f64>, ProtocolError> {
        self.expect_type(Datatype::Fp64)?;
        let v: Vec<f64> = match &self.data {
            InputData::Json(d) => {
                self.json_numbers(d)?;
                d.values.clone()
            }
            InputData::Binary(b) => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            InputData::Strings(_) => return Err(self.not_strings()),
        };
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(self.non_finite(i, v[i]));
        }
        Ok(v)
    }

    /// Decode an INT32 tensor.
    pub fn to_i32(&self) -> Result<Vec<i32>, ProtocolError> {
        self.expect_type(Datatype::I32)?;
        match &self.data {
            InputData::Json(d) => {
                self.json_numbers(d)?;
                d.values
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        if x.fract() != 0.0 || x < i32::MIN as f64 || x > i32::MAX as f64 {
                            err(format!(
                                "input `{}` element {i} is {x}; expected an INT32 integer",
                                self.name
                            ))
                        } else {
                            Ok(x as i32)
                        }
                    })
                    .collect()
            }
            InputData::Binary(b) => Ok(b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            InputData::Strings(_) => Err(self.not_strings()),
        }
    }

    /// Decode a BOOL tensor.
    pub fn to_bool(&self) -> Result<Vec<bool>, ProtocolError> {
        self.expect_type(Datatype::Bool)?;
        match &self.data {
            InputData::Json(d) => {
                if d.has_number {
                    return err(format!(
                        "input `{}` of datatype BOOL has numeric elements; expected true or false",
                        self.name
                    ));
                }
                Ok(d.values.iter().map(|&x| x != 0.0).collect())
            }
            InputData::Binary(b) => b
                .iter()
                .enumerate()
                .map(|(i, &x)| match x {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => err(format!(
                        "input `{}` element {i} is byte {x}; a BOOL is 0 or 1",
                        self.name
                    )),
                })
                .collect(),
            InputData::Strings(_) => Err(self.not_strings()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::request::InferRequest;
    use super::*;

    fn parse(s: &str) -> Result<InferRequest, ProtocolError> {
        InferRequest::parse(Bytes::from(s.to_string()), None)
    }

    #[test]
    fn binary_bool_and_fp64_decode_and_bad_bools_are_refused() {
        let json = r#"{"inputs":[{"name":"b","shape":[3],"datatype":"BOOL","parameters":{"binary_data_size":3}},{"name":"d","shape":[1],"datatype":"FP64","parameters":{"binary_data_size":8}}]}"#;
        let mut body = json.as_bytes().to_vec();
        body.extend([1u8, 0, 1]);
        body.extend(0.125f64.to_le_bytes());
        let r =
            InferRequest::parse(Bytes::from(body.clone()), Some(&json.len().to_string())).unwrap();
        assert_eq!(r.inputs[0].to_bool().unwrap(), vec![true, false, true]);
        assert_eq!(r.inputs[1].to_f64().unwrap(), vec![0.125]);
        let e = r.inputs[1].to_f32().unwrap_err();
        assert!(e.0.contains("datatype FP64; expected FP32"), "{e}");
        body[json.len() + 1] = 7;
        let r = InferRequest::parse(Bytes::from(body), Some(&json.len().to_string())).unwrap();
        assert!(r.inputs[0].to_bool().unwrap_err().0.contains("byte 7"));
        let j = parse(r#"{"inputs":[{"name":"b","shape":[2],"datatype":"BOOL","data":[true,1]}]}"#)
            .unwrap();
        assert!(
            j.inputs[0]
                .to_bool()
                .unwrap_err()
                .0
                .contains("numeric elements")
        );
        let j = parse(r#"{"inputs":[{"name":"i","shape":[2],"datatype":"INT32","data":[1,2.5]}]}"#)
            .unwrap();
        assert!(
            j.inputs[0]
                .to_i32()
                .unwrap_err()
                .0
                .contains("expected an INT32")
        );
    }
}
