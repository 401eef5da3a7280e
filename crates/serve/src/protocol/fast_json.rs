//! A single-pass reader for the usual shape of a JSON inference request, beside the serde
//! reader in [`super::request`].
//!
//! serde_json scans a tensor's `data` array and then converts every number through its
//! correctly rounded (`float_roundtrip`) path. On a batch-64 request of ten features (640
//! FP32 values), as tritonclient sends them (every float printed with 17 digits), that was
//! 31 µs of a 133 µs round trip (`kiln bench serve`). This reader scans each number once and converts it
//! from the digits it already holds. The conversion is exact, so the result is the
//! correctly rounded double that serde_json gives, to the bit:
//!
//! * at most 2^53 in the significand and a power of ten up to 10^22: one IEEE multiplication
//!   or division of two exact doubles (Clinger's fast path);
//! * a larger significand of at most 19 digits and an exponent within ±19: the exact product
//!   in 128-bit integers, or the quotient by 10^k to 58 bits with a sticky bit for the rest,
//!   rounded once by the integer-to-float conversion;
//! * anything else: the standard library's correctly rounded parser on the number's text.
//!
//! It reads only what it fully understands: strings without escapes, keys of the request's
//! own fields, `data` as numbers in (nested) arrays, `shape` as integers. Other values
//! (`parameters`, `outputs`, `id`, fields the reader does not know) are delimited here and
//! read by serde_json. Anything else — an escape, a boolean or string element, a duplicate
//! key, a number out of range, malformed JSON — returns `None`, and the serde reader parses
//! the body from the start, so every error message stays serde's, with its line and column.
//! Both readers give the same request; the tests compare them on generated and damaged
//! bodies.

use serde::de::DeserializeOwned;

use super::raw::{RawInput, RawRequest};
use super::tensor::JsonData;

/// Deepest nesting of `data` arrays read here (deeper goes to serde, which has its own limit).
const MAX_DATA_DEPTH: usize = 64;

/// Exact powers of ten as doubles (10^22 is the largest).
const POW10_F64: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Powers of ten that fit in a `u64` (10^19 is the largest).
const POW10_U64: [u64; 20] = {
    let mut t = [1u64; 20];
    let mut i = 1;
    while i < 20 {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// Parse a request's JSON part, or `None` when it is not of the shape this reader handles.
pub(super) fn request(json: &[u8]) -> Option<RawRequest> {
    let mut r = Reader { s: json, i: 0 };
    let out = r.request()?;
    r.ws();
    (r.i == json.len()).then_some(out)
}

struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    #[inline]
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// After a member or element: `true` at `,` (another follows), `false` at `close`.
    #[inline]
    fn next_or_close(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// A string without escapes or control characters, as UTF-8.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let len = self.s[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if self.s[start + len] != b'"' {
            return None;
        }
        self.i = start + len + 1;
        std::str::from_utf8(&self.s[start..start + len]).ok()
    }

    /// Any JSON value, delimited here (up to the `,`, `]` or `}` that ends it) and read by
    /// serde_json, which checks it.
    fn serde_value<T: DeserializeOwned>(&mut self) -> Option<T> {
        let start = self.i;
        let mut depth = 0usize;
        loop {
            match *self.s.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    loop {
                        match *self.s.get(self.i)? {
                            b'"' => break,
                            b'\\' => self.i += 2,
                            _ => self.i += 1,
                        }
                    }
                }
                b'[' | b'{' => depth += 1,
                b']' | b'}' if depth > 0 => depth -= 1,
                b',' if depth > 0 => {}
                b',' | b']' | b'}' => break,
                _ => {}
            }
            self.i += 1;
        }
        serde_json::from_slice(&self.s[start..self.i]).ok()
    }

    fn request(&mut self) -> Option<RawRequest> {
        self.eat(b'{')?;
        let (mut id, mut parameters, mut inputs, mut outputs) = (None, None, None, None);
        if self.peek()? == b'}' {
            return None; // no `inputs`: serde's message
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            match key {
                "id" => set_once(&mut id, self.serde_value()?)?,
                "parameters" => set_once(&mut parameters, self.serde_value()?)?,
                "outputs" => set_once(&mut outputs, self.serde_value()?)?,
                "inputs" => set_once(&mut inputs, self.inputs()?)?,
                _ => {
                    self.serde_value::<serde::de::IgnoredAny>()?;
                }
            }
            if !self.next_or_close(b'}')? {
                break;
            }
        }
        Some(RawRequest {
            id: id.flatten(),
            parameters: parameters.flatten(),
            inputs: inputs?,
            outputs: outputs.flatten(),
        })
    }

    fn inputs(&mut self) -> Option<Vec<RawInput>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(out);
        }
        loop {
            out.push(self.input()?);
            if !self.next_or_close(b']')? {
                return Some(out);
            }
        }
    }

    fn input(&mut self) -> Option<RawInput> {
        self.eat(b'{')?;
        let (mut name, mut shape, mut datatype, mut parameters, mut data) =
            (None, None::<Vec<i64>>, None, None, None);
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            match key {
                "name" => set_once(&mut name, self.string()?.to_string())?,
                "datatype" => set_once(&mut datatype, self.string()?.to_string())?,
                "shape" => set_once(&mut shape, self.shape()?)?,
                "parameters" => set_once(&mut parameters, self.serde_value()?)?,
                "data" => {
                    // Reserve what the shape says, bounded by what the bytes left can hold.
                    let hint = shape
                        .as_ref()
                        .and_then(|s| {
                            s.iter()
                                .try_fold(1usize, |a, &d| a.checked_mul(d.try_into().ok()?))
                        })
                        .unwrap_or(0)
                        .min((self.s.len() - self.i) / 2);
                    set_once(&mut data, self.data(hint)?)?
                }
                _ => {
                    self.serde_value::<serde::de::IgnoredAny>()?;
                }
            }
            if !self.next_or_close(b'}')? {
                break;
            }
        }
        Some(RawInput {
            name: name?,
            shape: shape?,
            datatype: datatype?,
            parameters: parameters.flatten(),
            data,
        })
    }

    /// `[d, …]`: JSON integers that fit an `i64`.
    fn shape(&mut self) -> Option<Vec<i64>> {
        self.eat(b'[')?;
        let mut out = Vec::with_capacity(4);
        if self.peek()? == b']' {
            self.i += 1;
            return Some(out);
        }
        loop {
            self.ws();
            let neg = self.s.get(self.i) == Some(&b'-');
            self.i += neg as usize;
            let start = self.i;
            let mut v: i64 = 0;
            while let Some(&c @ b'0'..=b'9') = self.s.get(self.i) {
                let d = (c - b'0') as i64;
                v = v.checked_mul(10)?.checked_add(if neg { -d } else { d })?;
                self.i += 1;
            }
            let digits = self.i - start;
            if digits == 0 || (digits > 1 && self.s[start] == b'0') {
                return None;
            }
            out.push(v);
            if !self.next_or_close(b']')? {
                return Some(out);
            }
        }
    }

    /// A tensor's `data`: numbers, flat or in nested arrays, flattened in order.
    fn data(&mut self, hint: usize) -> Option<JsonData> {
        if self.peek()? != b'[' {
            return None; // a bare value or null: serde's reading
        }
        let mut values = Vec::with_capacity(hint);
        let mut depth = 0usize;
        'value: loop {
            // At a value's place: open an array (closing it at once when it is empty) or
            // read a number.
            if self.peek()? == b'[' {
                depth += 1;
                if depth > MAX_DATA_DEPTH {
                    return None;
                }
                self.i += 1;
                if self.peek()? != b']' {
                    continue 'value;
                }
                self.i += 1;
                depth -= 1;
            } else {
                values.push(number(self.s, &mut self.i)?);
            }
            // After a value: `,` before the next one, or the arrays it closes.
            while depth > 0 {
                match self.next_or_close(b']')? {
                    true => continue 'value,
                    false => depth -= 1,
                }
            }
            break;
        }
        Some(JsonData {
            has_number: !values.is_empty(),
            values,
            has_bool: false,
            strings: Vec::new(),
        })
    }
}

/// Store a field's value, or `None` when the key came before (serde refuses duplicates).
fn set_once<T>(slot: &mut Option<T>, v: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(v);
    Some(())
}

/// One JSON number at `s[*i..]`, advancing `*i` past it: the correctly rounded double, or
/// `None` when the text is not a JSON number or its value is not finite.
#[inline]
fn number(s: &[u8], i: &mut usize) -> Option<f64> {
    let start = *i;
    let mut p = start;
    let neg = s.get(p) == Some(&b'-');
    p += neg as usize;
    // The significand's digits from the first non-zero one (`nd` of them, in `m` while
    // there are at most 19) and the power of ten that scales it.
    let mut m: u64 = 0;
    let mut nd = 0usize;
    match s.get(p) {
        Some(b'0') => p += 1,
        Some(b'1'..=b'9') => digits(s, &mut p, &mut m, &mut nd),
        _ => return None,
    }
    let mut exp: i64 = 0;
    if s.get(p) == Some(&b'.') {
        p += 1;
        let f0 = p;
        if nd == 0 {
            while s.get(p) == Some(&b'0') {
                p += 1;
            }
        }
        digits(s, &mut p, &mut m, &mut nd);
        if p == f0 {
            return None;
        }
        exp = -((p - f0) as i64);
    }
    if let Some(b'e' | b'E') = s.get(p) {
        p += 1;
        let eneg = s.get(p) == Some(&b'-');
        p += matches!(s.get(p), Some(b'-' | b'+')) as usize;
        let e0 = p;
        let mut e: i64 = 0;
        while let Some(&c @ b'0'..=b'9') = s.get(p) {
            e = (e * 10 + (c - b'0') as i64).min(1 << 40);
            p += 1;
        }
        if p == e0 {
            return None;
        }
        exp += if eneg { -e } else { e };
    }
    *i = p;
    let v = match (nd <= 19).then(|| exact(m, exp)).flatten() {
        Some(v) if neg => -v,
        Some(v) => v,
        // The text is ASCII (digits, sign, `.`, `e`), checked above.
        None => std::str::from_utf8(&s[start..p])
            .ok()?
            .parse::<f64>()
            .ok()?,
    };
    v.is_finite().then_some(v)
}

/// Read a run of digits into `m` (wrapping past 19 digits; `nd` counts them all), eight
/// and four at a time where they are there.
#[inline(always)]
fn digits(s: &[u8], p: &mut usize, m: &mut u64, nd: &mut usize) {
    while let Some(chunk) = s.get(*p..*p + 8) {
        let v = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        // Every byte in 0x30..=0x39: its high nibble is 3, and adding 6 keeps it 3.
        let high = 0xF0F0_F0F0_F0F0_F0F0;
        if (v & high) | ((v.wrapping_add(0x0606_0606_0606_0606) & high) >> 4)
            != 0x3333_3333_3333_3333
        {
            break;
        }
        // Digit pairs into bytes 0, 2, 4, 6, then the pairs weighted into the top half.
        let v = v - 0x3030_3030_3030_3030;
        let v = v.wrapping_mul(10).wrapping_add(v >> 8);
        let a = (v & 0x0000_00FF_0000_00FF).wrapping_mul(100 + (1_000_000 << 32));
        let b = ((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32));
        *m = m
            .wrapping_mul(100_000_000)
            .wrapping_add(a.wrapping_add(b) >> 32);
        *nd += 8;
        *p += 8;
    }
    if let Some(chunk) = s.get(*p..*p + 4) {
        let v = u32::from_le_bytes(chunk.try_into().expect("four bytes"));
        let high = 0xF0F0_F0F0;
        if (v & high) | ((v.wrapping_add(0x0606_0606) & high) >> 4) == 0x3333_3333 {
            let v = v - 0x3030_3030;
            let v = v.wrapping_mul(10).wrapping_add(v >> 8);
            *m = m
                .wrapping_mul(10_000)
                .wrapping_add(((v & 0xFF) * 100 + ((v >> 16) & 0xFF)) as u64);
            *nd += 4;
            *p += 4;
        }
    }
    while let Some(&c @ b'0'..=b'9') = s.get(*p) {
        *m = m.wrapping_mul(10).wrapping_add((c - b'0') as u64);
        *nd += 1;
        *p += 1;
    }
}

/// `m × 10^exp` correctly rounded, where the arithmetic below is exact; `None` elsewhere.
#[inline]
fn exact(m: u64, exp: i64) -> Option<f64> {
    if m == 0 {
        return Some(0.0);
    }
    if m <= 1 << 53 && (-22..=22).contains(&exp) {
        // Both operands are exact doubles; one IEEE operation rounds once.
        let f = m as f64;
        return Some(if exp < 0 {
            f / POW10_F64[(-exp) as usize]
        } else {
            f * POW10_F64[exp as usize]
        });
    }
    if !(-19..=19).contains(&exp) {
        return None;
    }
    if exp >= 0 {
        // m < 2^64 and 10^exp < 2^64: the product is exact in 128 bits; the conversion
        // rounds once, to nearest, ties to even.
        return Some((m as u128 * POW10_U64[exp as usize] as u128) as f64);
    }
    let d = POW10_U64[(-exp) as usize];
    // The quotient by 10^k to 57 or 58 bits (m scaled by 2^s), with a sticky bit for a
    // non-zero remainder: 2q + sticky has at least five bits below the double's 53, so
    // converting it rounds exactly as the true quotient would.
    let s = 57 + (64 - d.leading_zeros() as i32) - (64 - m.leading_zeros() as i32);
    if s < 0 {
        return None;
    }
    let n = (m as u128) << s;
    let q = (n / d as u128) as u64;
    let sticky = n != q as u128 * d as u128;
    let x = (q << 1) | sticky as u64;
    // 2^-(s+1), exact: s + 1 ≤ 122.
    let scale = f64::from_bits(((1023 - (s + 1)) as u64) << 52);
    Some(x as f64 * scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_model::rng::SplitMix64 as Rng;

    fn parse_number(t: &str) -> Option<f64> {
        let mut i = 0;
        let v = number(t.as_bytes(), &mut i)?;
        (i == t.len()).then_some(v)
    }

    /// A random JSON number's text: how doubles and floats print, and long, short, padded
    /// and exponent forms.
    fn random_number(r: &mut Rng) -> String {
        match r.below(6) {
            0 => format!("{:?}", f64::from_bits(r.next_u64()) % 1e6),
            1 => format!("{}", (f32::from_bits(r.next_u64() as u32) % 1e4) as f64),
            2 => format!("{:e}", f64::from_bits(r.next_u64())),
            3 => {
                let digits: String = (0..1 + r.below(24))
                    .map(|_| char::from(b'0' + r.below(10) as u8))
                    .collect();
                let digits = digits.trim_start_matches('0');
                let digits = if digits.is_empty() { "0" } else { digits };
                let cut = r.below(digits.len() as u64 + 1) as usize;
                let (a, b) = digits.split_at(cut);
                let a = if a.is_empty() { "0" } else { a };
                let mut t = if b.is_empty() {
                    a.to_string()
                } else {
                    format!("{a}.{b}")
                };
                if r.below(3) == 0 {
                    t += &format!("e{}", r.below(60) as i64 - 30);
                }
                t
            }
            4 => format!("{}", r.next_u64() >> r.below(64)),
            _ => format!("{}", (r.below(2_000_001) as f64 - 1e6) / 1e3),
        }
        .replace("inf", "1e999")
        .replace("NaN", "0")
    }

    #[test]
    fn numbers_convert_to_the_bit_as_the_standard_library_and_serde_json_do() {
        let mut r = Rng::new(29);
        let edge = [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "1",
            "-1",
            "9007199254740992",
            "9007199254740993",
            "9007199254740995",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "0.1",
            "0.30000000000000004",
            "2.2250738585072014e-308",
            "4.9e-324",
            "1e-400",
            "1.7976931348623157e308",
            "123456789012345678901234567890",
            "0.000000000000000000001234567890123456789",
            "1E5",
            "1e+5",
            "1e-5",
            "5e-324",
            "51.789276123046875",
            "439.8119812011719",
            "1.00000000000000011102230246251565404",
            "9999999999999999999",
            "99999999999999999.5",
            "0.00001234567890123456",
        ];
        let mut texts: Vec<String> = edge.iter().map(|s| s.to_string()).collect();
        for _ in 0..200_000 {
            let t = random_number(&mut r);
            texts.push(if r.below(4) == 0 && !t.starts_with('-') {
                format!("-{t}")
            } else {
                t
            });
        }
        for t in &texts {
            let want: f64 = t.parse().unwrap();
            let got = parse_number(t);
            if !want.is_finite() {
                assert_eq!(got, None, "{t}");
                continue;
            }
            let got = got.unwrap_or_else(|| panic!("{t} not read"));
            assert_eq!(got.to_bits(), want.to_bits(), "{t}: {got:e} vs {want:e}");
            let serde: f64 = serde_json::from_str(t).unwrap();
            assert_eq!(got.to_bits(), serde.to_bits(), "{t}: serde_json {serde:e}");
        }
    }

    #[test]
    fn what_json_does_not_allow_is_not_a_number() {
        for t in [
            "", "-", "+1", "01", "-01", ".5", "1.", "1.e5", "1e", "1e+", "--1", "0x10", "1e999",
            "-1e400",
        ] {
            assert_eq!(parse_number(t), None, "{t}");
        }
        // A number ends where its grammar does; the caller checks what follows.
        let mut i = 0;
        assert_eq!(number(b"12.5,3", &mut i), Some(12.5));
        assert_eq!(i, 4);
    }

    #[test]
    fn the_usual_forms_are_converted_without_the_fallback() {
        // 17-digit doubles (what `tolist()` prints), shortest floats, integers.
        for (m, e) in [
            (51_789_276_123_046_875u64, -15),
            (4_398_119_812_011_719, -13),
            (51_789_276, -6),
            (123, 0),
            (18_446_744_073_709_551_615, 0),
            (12_345_678_901_234_567, 3),
            (1, -19),
        ] {
            let want: f64 = format!("{m}e{e}").parse().unwrap();
            assert_eq!(
                exact(m, e).map(f64::to_bits),
                Some(want.to_bits()),
                "{m}e{e}"
            );
        }
    }

    /// Random whitespace, as clients pretty-print.
    fn ws(r: &mut Rng) -> &'static str {
        ["", "", "", " ", "\n  ", "\t", "\r\n"][r.below(7) as usize]
    }

    /// A random request body of the usual shape, members in random order.
    fn random_request(r: &mut Rng) -> String {
        fn data(r: &mut Rng, depth: usize) -> String {
            let n = r.below(6);
            let items: Vec<String> = (0..n)
                .map(|_| {
                    if depth < 3 && r.below(4) == 0 {
                        data(r, depth + 1)
                    } else {
                        let t = random_number(r);
                        if r.below(3) == 0 && !t.starts_with('-') {
                            format!("-{t}")
                        } else {
                            t
                        }
                    }
                })
                .collect();
            let w = ws(r);
            format!("[{w}{}{w}]", items.join(&format!("{w},{}", ws(r))))
        }
        let inputs: Vec<String> = (0..1 + r.below(3))
            .map(|k| {
                let mut members = vec![
                    format!(r#""name"{}:{}"x{k}""#, ws(r), ws(r)),
                    format!(
                        r#""shape":[{}{}]"#,
                        1 + r.below(64),
                        [",1", "", ", 2"][r.below(3) as usize]
                    ),
                    format!(
                        r#""datatype":"{}""#,
                        ["FP32", "FP64", "INT64"][r.below(3) as usize]
                    ),
                    format!(r#""data":{}{}"#, ws(r), data(r, 0)),
                ];
                if r.below(4) == 0 {
                    members.push(r#""parameters":{"a":[1,{"b":"]}\"x"}]}"#.into());
                }
                if r.below(5) == 0 {
                    members.push(r#""extra" : [ {"}":","} , null ]"#.into());
                }
                let k = r.below(members.len() as u64) as usize;
                let last = members.len() - 1;
                members.swap(k, last);
                format!(
                    "{{{}{}{}}}",
                    ws(r),
                    members.join(&format!(",{}", ws(r))),
                    ws(r)
                )
            })
            .collect();
        let mut members = vec![format!(r#""inputs":{}[{}]"#, ws(r), inputs.join(","))];
        if r.below(3) == 0 {
            members.push(r#""id":"req-7""#.into());
        }
        if r.below(3) == 0 {
            members.push(r#""parameters":{"binary_data_output":false,"priority":2}"#.into());
        }
        if r.below(3) == 0 {
            members
                .push(r#""outputs":[{"name":"mean","parameters":{"binary_data":false}}]"#.into());
        }
        if r.below(2) == 0 {
            let last = members.len() - 1;
            members.swap(0, last);
        }
        format!(
            "{}{{{}}}{}",
            ws(r),
            members.join(&format!("{},", ws(r))),
            ws(r)
        )
    }

    fn serde_reader(s: &[u8]) -> Option<RawRequest> {
        serde_json::from_slice(s).ok()
    }

    /// Equal fields, and the numbers equal to the bit (`-0.0 == 0.0` for `PartialEq`).
    fn same(a: &RawRequest, b: &RawRequest) -> bool {
        let bits = |r: &RawRequest| -> Vec<u64> {
            r.inputs
                .iter()
                .flat_map(|i| {
                    i.data
                        .iter()
                        .flat_map(|d| d.values.iter().map(|v| v.to_bits()))
                })
                .collect()
        };
        a == b && bits(a) == bits(b)
    }

    #[test]
    fn usual_requests_take_the_single_pass_and_read_as_serde_reads_them() {
        let mut r = Rng::new(7);
        for _ in 0..3000 {
            let body = random_request(&mut r);
            let fast = request(body.as_bytes()).unwrap_or_else(|| panic!("not read: {body:?}"));
            let serde = serde_reader(body.as_bytes()).unwrap();
            assert!(same(&fast, &serde), "{body}");
        }
        // What tritonclient and `kiln loadtest` send.
        let triton = r#"{"inputs":[{"name":"INPUT0","shape":[2,1],"datatype":"FP32","data":[0.10000000149011612,2.5]}],"outputs":[{"name":"mean","parameters":{"binary_data":false}}]}"#;
        assert!(request(triton.as_bytes()).is_some());
    }

    #[test]
    fn damaged_or_unusual_requests_are_left_to_serde_or_read_alike() {
        let mut r = Rng::new(11);
        let bytes = b" ,:[]{}\"\\-.e0123456789tfnu";
        let (mut taken, mut left) = (0, 0);
        for _ in 0..20_000 {
            let mut body = random_request(&mut r).into_bytes();
            for _ in 0..1 + r.below(3) {
                let at = r.below(body.len() as u64) as usize;
                match r.below(3) {
                    0 => {
                        body.remove(at);
                    }
                    1 => body.insert(at, bytes[r.below(bytes.len() as u64) as usize]),
                    _ => body[at] = bytes[r.below(bytes.len() as u64) as usize],
                }
            }
            let serde = serde_reader(&body);
            match request(&body) {
                Some(fast) => {
                    let text = String::from_utf8_lossy(&body);
                    let serde =
                        serde.unwrap_or_else(|| panic!("serde refuses what was read: {text}"));
                    assert!(same(&fast, &serde), "{text}");
                    taken += 1;
                }
                None => left += 1,
            }
        }
        // Both branches ran many times.
        assert!(
            taken > 1000 && left > 1000,
            "{taken} read, {left} left to serde"
        );
        // Forms this reader leaves to serde on purpose.
        for body in [
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"BOOL","data":[true]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"BYTES","data":["a"]}]}"#,
            r#"{"inputs":[{"name":"\u0078","shape":[1],"datatype":"FP32","data":[1]}]}"#,
            r#"{"inputs":[{"name":"x","name":"y","shape":[1],"datatype":"FP32","data":[1]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":1}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1e999]}]}"#,
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]} x"#,
            r#"{"inputs":[]}"#,
        ] {
            let fast = request(body.as_bytes());
            if body == r#"{"inputs":[]}"# {
                assert!(fast.is_some_and(|f| f.inputs.is_empty()));
            } else {
                assert!(fast.is_none(), "{body}");
            }
        }
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_DATA_DEPTH + 1),
            "]".repeat(MAX_DATA_DEPTH + 1)
        );
        let body =
            format!(r#"{{"inputs":[{{"name":"x","shape":[1],"datatype":"FP32","data":{deep}}}]}}"#);
        assert!(request(body.as_bytes()).is_none());
    }
}
