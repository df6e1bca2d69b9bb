//! Log lines of any shape: no panic, and a line that matches a signature is always a candidate
//! (the cheap first look never hides a match); the same for the recogniser over the lines of a
//! container in a row (its window of recent lines, PyTorch's worker lines).
#![no_main]
use libfuzzer_sys::fuzz_target;
use shmlink::failures::detect::Recogniser;
use shmlink::model::SHM_OOM_SHARE;
use shmlink::failures::Signatures;
use shmlink::logs::LogLine;
use shmlink::model::ContainerRef;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

static SIGS: OnceLock<Signatures> = OnceLock::new();
/// Made once (its automata are costly), cloned fresh for each input.
static RECOGNISER: OnceLock<Recogniser> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let sigs = SIGS.get_or_init(Signatures::new);
    let text = String::from_utf8_lossy(data);
    if sigs.match_line(&text).is_some() {
        assert!(sigs.is_candidate(text.as_bytes()));
    }
    if std::str::from_utf8(data).is_ok() && !sigs.is_candidate(data) {
        assert!(sigs.match_line(&text).is_none());
    }
    let mut r = RECOGNISER
        .get_or_init(|| Recogniser::new("/nonexistent".into(), None, SHM_OOM_SHARE))
        .clone();
    for (i, l) in text.lines().enumerate() {
        let line = LogLine {
            origin: ContainerRef::by_id(&"a".repeat(64), None),
            at: SystemTime::UNIX_EPOCH + Duration::from_millis(i as u64 * 100),
            text: l.to_string(),
        };
        if r.log_line(&line).is_some() {
            assert!(r.is_candidate(l.as_bytes()), "{l:?}");
        }
    }
});
