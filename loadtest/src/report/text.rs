//! A [`Doc`] as terminal text: its tables in markdown, charts left out.

use std::fmt::Write as _;

use super::{Block, Doc};

pub fn render(doc: &Doc) -> String {
    let m = &doc.meta;
    let mut out = format!("# {}\n{}\n{}\n", doc.title, m.line(), m.command);
    for block in &doc.blocks {
        match block {
            Block::Heading(h) => _ = write!(out, "\n## {h}\n"),
            Block::Lines(lines) => lines.iter().for_each(|l| _ = writeln!(out, "{l}")),
            Block::Table(t) => {
                let row = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
                out.push_str(&row(&t.columns));
                out.push_str(&row(&vec!["---".to_owned(); t.columns.len()]).replace(' ', ""));
                t.rows.iter().for_each(|r| out.push_str(&row(r)));
            }
            Block::Chart(_) => {}
        }
    }
    out
}
