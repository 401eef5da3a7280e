//! The one XML/HTML text escaper (SVG titles, the runs report), and counted nouns.

/// `n` and the noun, plural unless `n` is 1: `count(1, "target")` is `1 target`,
/// `count(3, "target")` is `3 targets`.
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Escape `& < > " '` for XML/HTML text and attribute values; control characters that XML 1.0
/// forbids (all below U+0020 except tab, newline and carriage return, and U+FFFE/U+FFFF)
/// become `?`.
pub fn escape_xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn counted_nouns_are_plural_unless_one() {
        assert_eq!(super::count(1, "target"), "1 target");
        assert_eq!(super::count(0, "target"), "0 targets");
        assert_eq!(super::count(3, "feature"), "3 features");
    }

    #[test]
    fn escapes_markup() {
        assert_eq!(
            super::escape_xml(r#"a<b & "c" 'd'>"#),
            "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;"
        );
        assert_eq!(super::escape_xml("a\u{1}b\nc"), "a?b\nc");
    }
}
