//! Owns: the command line's `info`: summaries of saved trees and archives from their meta.json alone, rendered as text or JSON.
//! Uses: `error`, `sys`, `format`, `tree`, `archive`.

pub mod render;
pub mod summary;
