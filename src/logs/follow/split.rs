//! Line splitting: a file's bytes cut at `\n`, a bounded head kept of a line not yet ended.

use crate::logs::{extend_within, MAX_LINE};

use super::CHUNK;

/// Bytes kept of one line of a file before it is parsed. Above MAX_LINE, since a Docker entry
/// of a 16 KiB part can escape each byte to six (`\u0000`).
const PHYS_MAX: usize = 4 * MAX_LINE;

/// Cuts a file's bytes into lines, keeping at most PHYS_MAX bytes of an unfinished one.
#[derive(Default)]
pub(super) struct Splitter {
    head: Vec<u8>,
    cut: bool,
    /// Dropping bytes up to and including the next `\n`: reading began inside a line.
    skipping: bool,
    /// Bytes fed since the last `\n` (more than `head` holds when the line was cut): a saved
    /// position ends before them.
    unended: u64,
}

impl Splitter {
    /// The bytes fed until the next `\n` (and it) are the end of a line begun before them:
    /// dropped, not taken for a line.
    pub(super) fn skip_to_next_line(&mut self) {
        self.skipping = true;
    }

    pub(super) fn feed(&mut self, mut chunk: &[u8], sink: &mut dyn FnMut(&[u8], bool)) {
        match memchr::memrchr(b'\n', chunk) {
            Some(i) => self.unended = (chunk.len() - i - 1) as u64,
            None => self.unended += chunk.len() as u64,
        }
        if self.skipping {
            let Some(i) = memchr::memchr(b'\n', chunk) else {
                return;
            };
            self.skipping = false;
            chunk = &chunk[i + 1..];
        }
        while let Some(i) = memchr::memchr(b'\n', chunk) {
            if self.head.is_empty() && !self.cut {
                sink(&chunk[..i], false); // the usual case: no copy
            } else {
                self.keep(&chunk[..i]);
                self.finish(sink);
            }
            chunk = &chunk[i + 1..];
        }
        self.keep(chunk);
    }

    fn keep(&mut self, part: &[u8]) {
        if extend_within(&mut self.head, part, PHYS_MAX) {
            self.cut = true;
        }
    }

    /// Bytes fed after the last whole line.
    pub(super) fn unended(&self) -> u64 {
        self.unended
    }

    /// Hands over the unfinished line, if any.
    pub(super) fn finish(&mut self, sink: &mut dyn FnMut(&[u8], bool)) {
        self.skipping = false;
        self.unended = 0;
        if !self.head.is_empty() || self.cut {
            sink(&self.head, self.cut);
        }
        self.cut = false;
        self.head.clear();
        if self.head.capacity() > CHUNK {
            self.head = Vec::new(); // one long line must not keep its buffer for every idle file
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<(Vec<u8>, bool)> {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        for chunk in chunks {
            s.feed(chunk, &mut |line, cut| out.push((line.to_vec(), cut)));
        }
        out
    }

    #[test]
    fn lines_are_cut_at_newlines_across_chunks() {
        let got = split(&[b"one\ntw", b"o\n", b"", b"three\n\nfour"]);
        let want: Vec<(Vec<u8>, bool)> = [&b"one"[..], b"two", b"three", b""]
            .iter()
            .map(|l| (l.to_vec(), false))
            .collect();
        assert_eq!(got, want, "four has no newline yet");
    }

    #[test]
    fn an_endless_line_keeps_only_its_head() {
        let big = vec![b'x'; PHYS_MAX + 100];
        let got = split(&[&big, &big, b"\nnext\n"]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0.len(), PHYS_MAX);
        assert!(got[0].1);
        assert_eq!(got[1], (b"next".to_vec(), false));
    }

    #[test]
    fn reading_begun_inside_a_line_drops_it_up_to_its_newline() {
        let mut s = Splitter::default();
        s.skip_to_next_line();
        let mut out = Vec::new();
        for chunk in [&b"tail of a"[..], b" line\nwhole\n"] {
            s.feed(chunk, &mut |l, _| out.push(l.to_vec()));
        }
        assert_eq!(out, [b"whole".to_vec()]);
        // Begun just after a newline: the first byte fed is that newline, nothing is lost.
        let mut s = Splitter::default();
        s.skip_to_next_line();
        let mut out = Vec::new();
        s.feed(b"\nfirst\n", &mut |l, _| out.push(l.to_vec()));
        assert_eq!(out, [b"first".to_vec()]);
    }

    #[test]
    fn finish_hands_over_the_unfinished_line() {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        s.feed(b"a\nlast", &mut |l, _| out.push(l.to_vec()));
        s.finish(&mut |l, _| out.push(l.to_vec()));
        s.finish(&mut |l, _| out.push(l.to_vec()));
        assert_eq!(out, [b"a".to_vec(), b"last".to_vec()]);
    }
}
