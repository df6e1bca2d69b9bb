//! Pure: which part of one live name's files `check`'s catch-up reads when they hold more than
//! its bound. The newest bytes are kept (a workload's death is told by its last lines); what
//! is older is skipped, and counted, since `--since` already says how far back to look.

use super::handle::Position;

/// Given one live name's files oldest first, each with where reading would begin and the bytes
/// from there to its end (a gzipped file's decompressed size, from its trailer), keeps the
/// newest `budget` bytes: the newest file first; the one that does not fit whole is read from
/// its first line in the budget's last bytes (a gzipped one, which cannot be read from its
/// middle, not at all); those older not at all. Each file's start (None: not read) and the
/// bytes of it not read.
pub(super) fn keep_newest(files: &[(Position, u64)], budget: u64) -> Vec<(Option<Position>, u64)> {
    let mut left = budget;
    let mut out = vec![(None, 0); files.len()];
    for (i, &(at, bytes)) in files.iter().enumerate().rev() {
        out[i] = match at {
            // A gzipped file is read no further than its trailer said: a lying one cannot
            // spend what the files after it were given.
            Position::Gz(_) if bytes <= left => (Some(Position::Gz(bytes)), 0),
            _ if bytes <= left => (Some(at), 0),
            Position::At(offset) if left > 0 => (
                Some(Position::LineAt(offset + (bytes - left))),
                bytes - left,
            ),
            _ => (None, bytes),
        };
        left = left.saturating_sub(bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn what_fits_is_read_as_planned() {
        let files = [(Position::Gz(0), 40 * MIB), (Position::At(0), 10 * MIB)];
        let got = keep_newest(&files, 256 * MIB);
        assert_eq!(
            got,
            [
                (Some(Position::Gz(40 * MIB)), 0),
                (Some(Position::At(0)), 0)
            ]
        );
    }

    #[test]
    fn a_live_file_larger_than_the_budget_is_read_from_its_newest_bytes() {
        let got = keep_newest(&[(Position::At(0), 296 * MIB)], 256 * MIB);
        assert_eq!(got, [(Some(Position::LineAt(40 * MIB)), 40 * MIB)]);
    }

    #[test]
    fn older_files_give_way_to_newer_ones() {
        let files = [
            (Position::Gz(0), 5 * MIB),   // oldest: nothing left for it
            (Position::At(0), 200 * MIB), // cut: its newest 56 MiB
            (Position::At(0), 100 * MIB), // newest rotation: whole
            (Position::At(0), 100 * MIB), // the live file: whole
        ];
        let got = keep_newest(&files, 256 * MIB);
        assert_eq!(
            got,
            [
                (None, 5 * MIB),
                (Some(Position::LineAt(144 * MIB)), 144 * MIB),
                (Some(Position::At(0)), 0),
                (Some(Position::At(0)), 0),
            ]
        );
        let skipped: u64 = got.iter().map(|g| g.1).sum();
        assert_eq!(skipped, 405 * MIB - 256 * MIB);
    }

    #[test]
    fn a_gzipped_file_that_does_not_fit_is_not_read_and_an_end_costs_nothing() {
        let files = [(Position::Gz(0), 300 * MIB), (Position::End, 0)];
        let got = keep_newest(&files, 256 * MIB);
        assert_eq!(got, [(None, 300 * MIB), (Some(Position::End), 0)]);
        // From an offset, the bytes counted are those after it.
        let got = keep_newest(&[(Position::At(10), 30)], 20);
        assert_eq!(got, [(Some(Position::LineAt(20)), 10)]);
    }
}
