//! Pure: GPU samples over time -> a verdict per GPU pair, with reasons.
