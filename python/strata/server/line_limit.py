"""llama-server's two line-based limits of a completion (its `process_token`), for editors'
infill requests:

- `n_indent`: once a line break has been generated, every later line must start with at
  least `n_indent` spaces or tabs; the first line that does not (a blank one included) ends
  the completion, cut just before its first non-blank character;
- `t_max_predict_ms`: past this many milliseconds since the first generated token, the
  completion ends at the next piece of text that holds a line break (that piece kept).

Both end the completion as a limit (llama-server's `stop_type` "limit").
"""

from __future__ import annotations

__all__ = ["LineLimit"]


class LineLimit:
    """Fed the completion's text one token's piece at a time (after stop strings), as
    llama-server checks it: `feed` returns the text safe to send and whether a limit ended the
    completion; `flush` the text held back, at the end. A line still to be checked is held
    back, so that the answer never shows text the limit then cuts (llama-server streams it and
    cuts its final content)."""

    def __init__(self, n_indent: int, t_max_predict_s: float) -> None:
        self.n_indent = n_indent
        self.t_max = t_max_predict_s
        self.text = ""  # the completion so far
        self.sent = 0  # characters of it sent
        self.line = 0  # where the line to check starts (llama-server's last_nl_pos; 0: none)
        self.ok = -1  # the start of the line that passed its check
        self.has_new_line = False  # a line break was released (before this piece)
        self.stopped = False

    def feed(self, piece: str, since_first_token_s: float) -> tuple[str, bool]:
        """One token's text; `since_first_token_s`: seconds since the first generated token."""
        if self.stopped:
            return "", True
        self.text += piece
        t = self.text
        if self.has_new_line and self.n_indent > 0:
            if self.line > 0 and self.line != self.ok:
                pos = self.line
                while pos < len(t) and t[pos] in " \t":
                    pos += 1
                if pos < len(t):  # the line's indentation is known
                    if pos - self.line < self.n_indent:
                        self.text, self.stopped = t[:pos], True
                        return self._release(True), True
                    self.ok = self.line
            j = t.find("\n", self.line)  # on to the next line (one per token, as there)
            if j >= 0:
                self.line = j + 1
        if "\n" in piece:
            self.has_new_line = True
            if self.t_max > 0 and since_first_token_s > self.t_max:
                self.stopped = True
        return self._release(self.stopped), self.stopped

    def flush(self) -> str:
        """The text held back (the completion ended without the limit)."""
        return self._release(True)

    def _release(self, everything: bool) -> str:
        end = len(self.text)
        if not everything and self.n_indent > 0 and self.has_new_line:
            # from the first line the limit has yet to pass
            start = self.line if self.line > 0 else self.text.find("\n") + 1
            if start == self.ok:
                j = self.text.find("\n", start)
                start = end if j < 0 else j + 1
            end = min(end, start)
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out
