//! Newline-delimited reading with a bound: a peer that never sends a
//! newline cannot make us hold more than the limit (stdio MCP framing).

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// One line read, without its `\n` (or `\r\n`).
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Complete(Vec<u8>),
    /// The line was longer than the limit; its bytes were read and dropped.
    TooLong {
        bytes: usize,
    },
}

/// Reads the next line, keeping at most `max` bytes of it. `None` at end of
/// input; a last line without a newline still counts.
pub async fn next_line<R>(reader: &mut R, max: usize) -> std::io::Result<Option<Line>>
where
    R: AsyncBufRead + Unpin,
{
    let mut line = Vec::new();
    let mut total = 0usize;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(any.then(|| finish(line, total, max)));
        }
        any = true;
        let newline = chunk.iter().position(|&b| b == b'\n');
        let used = newline.unwrap_or(chunk.len());
        total = total.saturating_add(used);
        if total <= max {
            line.extend_from_slice(&chunk[..used]);
        } else {
            line = Vec::new(); // over the limit: stop holding it
        }
        reader.consume(used + usize::from(newline.is_some()));
        if newline.is_some() {
            return Ok(Some(finish(line, total, max)));
        }
    }
}

fn finish(mut line: Vec<u8>, total: usize, max: usize) -> Line {
    if total > max {
        return Line::TooLong { bytes: total };
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Line::Complete(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn all(input: &[u8], max: usize) -> Vec<Line> {
        let mut reader = tokio::io::BufReader::with_capacity(4, input);
        let mut out = Vec::new();
        while let Some(line) = next_line(&mut reader, max).await.unwrap() {
            out.push(line);
        }
        out
    }

    #[tokio::test]
    async fn lines_across_chunks_crlf_and_a_last_line_without_newline() {
        assert_eq!(
            all(b"abcdefgh\r\n\nxy", 9).await,
            vec![
                Line::Complete(b"abcdefgh".to_vec()),
                Line::Complete(Vec::new()),
                Line::Complete(b"xy".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn a_long_line_is_reported_with_its_size_and_the_next_is_intact() {
        assert_eq!(
            all(b"0123456789abc\nok\n", 8).await,
            vec![Line::TooLong { bytes: 13 }, Line::Complete(b"ok".to_vec())]
        );
    }
}
