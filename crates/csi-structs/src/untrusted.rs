//! Text that came from a plugin or a peer, made safe to show to a person or write to a log.
//!
//! A plugin chooses its volume ids, its `vendor_version`, its error messages; a peer agent
//! chooses what it reports. Printed as they are, a newline forges a table row or a log line,
//! a carriage return overwrites one, an escape sequence drives the terminal. [`escaped`]
//! writes every such character as a visible escape instead: control characters (C0, DEL,
//! C1), the Unicode line and paragraph separators, and the bidirectional controls that
//! reorder what a reader sees. Everything else, including spaces and non-ASCII letters,
//! stays as it is.
//!
//! Escaping is for people. Keep the exact value where a program reads it (JSON output,
//! state files, the next request to the plugin).
//!
//! A backslash is left alone, so escaping escaped text changes nothing and each layer that
//! shows a string may escape it without doubling backslashes. The price: a plugin that
//! writes a backslash and an `n` reads like one that wrote a newline; the exact value, in
//! JSON, tells them apart.
//!
//! ```
//! use csi_structs::untrusted::escaped;
//!
//! let id = "vol-1\n| forged | row |\u{1b}[2J";
//! assert_eq!(escaped(id).to_string(), r"vol-1\n| forged | row |\u{1b}[2J");
//! // Widths and alignment apply to the escaped text.
//! assert_eq!(format!("[{:<8}]", escaped("a\rb")), r"[a\rb    ]");
//! ```

use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// Whether `c` is written as an escape: a control character, a line or paragraph separator,
/// or a bidirectional control.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
                | '\u{061c}' | '\u{200e}' | '\u{200f}' // bidi marks
                | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
                | '\u{2066}'..='\u{2069}' // bidi isolates
        )
}

/// `text` with every character [`needs_escape`] names written as `\n`, `\r`, `\t`, `\0` or
/// `\u{..}`; borrowed when there is nothing to escape.
pub fn escape(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(needs_escape) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if needs_escape(c) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Shows `text` escaped (see the module docs); honours width, fill and alignment.
pub fn escaped(text: &str) -> Escaped<'_> {
    Escaped(text)
}

/// The [`Display`](fmt::Display) of [`escaped`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_could_forge_a_line_or_drive_a_terminal_is_escaped() {
        let cases = [
            ("plain-id_1.2", "plain-id_1.2"),
            ("名前 with space", "名前 with space"),
            ("a\nb", r"a\nb"),
            ("a\r\nb", r"a\r\nb"),
            ("tab\there", r"tab\there"),
            ("nul\0", r"nul\0"),
            ("\u{1b}[31mred", r"\u{1b}[31mred"),
            ("del\u{7f}", r"del\u{7f}"),
            ("c1\u{85}", r"c1\u{85}"),
            ("sep\u{2028}x", r"sep\u{2028}x"),
            ("bidi\u{202e}cba", r"bidi\u{202e}cba"),
            ("back\\slash", "back\\slash"),
        ];
        for (raw, shown) in cases {
            assert_eq!(escape(raw), shown, "{raw:?}");
            assert!(!escape(raw).chars().any(needs_escape), "{raw:?}");
        }
    }

    #[test]
    fn escaping_twice_changes_nothing_and_clean_text_is_borrowed() {
        let raw = "x\n\u{1b}y\\n";
        let once = escape(raw).into_owned();
        assert_eq!(escape(&once), once);
        assert!(matches!(escape("clean"), Cow::Borrowed("clean")));
    }

    #[test]
    fn widths_pad_the_escaped_text() {
        assert_eq!(format!("{:>6}|", escaped("a\nb")), "  a\\nb|");
        assert_eq!(format!("{:.3}|", escaped("abcdef")), "abc|");
    }
}
