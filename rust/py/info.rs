//! The command line's `info` (`cli/info.py`): a tree or archive summarized from its meta.json
//! files alone, as tuples or as the rendered report, the GIL released.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::tree::{LEAF, NODE, NON_TENSOR, STACK};
use crate::report::render;
use crate::report::summary;

fn summary_to_py<'py>(py: Python<'py>, node: summary::SummaryNode) -> PyResult<Bound<'py, PyTuple>> {
    let entries = PyList::empty(py);
    for (key, entry) in node.entries {
        let item = match entry {
            summary::SummaryEntry::Leaf { dtype, shape, nbytes } => {
                (LEAF, key, dtype, PyTuple::new(py, shape)?, nbytes).into_pyobject(py)?
            }
            summary::SummaryEntry::Node(child) => (NODE, key, summary_to_py(py, child)?).into_pyobject(py)?,
            summary::SummaryEntry::NonTensor(value) => {
                (NON_TENSOR, key, value.to_string()).into_pyobject(py)?
            }
            // (0, key, dtype, shape, nbytes, layout): -1 in the shape where components differ
            summary::SummaryEntry::Nested {
                dtype,
                shape,
                nbytes,
                jagged,
            } => (
                LEAF,
                key,
                dtype,
                PyTuple::new(py, shape)?,
                nbytes,
                if jagged { "torch.jagged" } else { "torch.strided" },
            )
                .into_pyobject(py)?,
            summary::SummaryEntry::Stack { shape } => {
                (STACK, key, PyTuple::new(py, shape)?).into_pyobject(py)?
            }
        };
        entries.append(item)?;
    }
    (node.batch, node.device, node.format_version, entries).into_pyobject(py)
}

/// Summarizes the tree at `prefix` from its meta.json files alone (no data file is opened),
/// with the GIL released. Returns `(batch_size, device, format_version, entries)` with entries
/// `(0, key, dtype, shape, nbytes)`, `(1, key, subtree)` or `(2, key, json_text)`.
#[pyfunction]
pub fn tree_summary<'py>(py: Python<'py>, prefix: PathBuf) -> PyResult<Bound<'py, PyTuple>> {
    // A file is read as a `.tdz` archive (its meta.json entries; no data entry is read).
    let node = py.detach(|| match prefix.is_file() {
        true => summary::summarize_archive(&prefix),
        false => summary::summarize(&prefix),
    })?;
    summary_to_py(py, node)
}

/// The command line's `info` report of the tree at `prefix` (a directory, or a `.tdz` archive
/// when `prefix` is a file), read from its meta.json files alone, as text or JSON, with `shown`
/// as the path it names. Walk and rendering run with the GIL released.
#[pyfunction]
#[pyo3(signature = (prefix, shown, *, json = false))]
pub fn tree_report(py: Python<'_>, prefix: PathBuf, shown: &str, json: bool) -> PyResult<String> {
    let report = py.detach(|| {
        let node = match prefix.is_file() {
            true => summary::summarize_archive(&prefix),
            false => summary::summarize(&prefix),
        }?;
        Ok::<_, crate::error::Error>(match json {
            true => render::json_report(shown, &node),
            false => render::text_report(shown, &node),
        })
    })?;
    Ok(report)
}
