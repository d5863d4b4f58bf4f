"""GPT-2's byte-level alphabet: how BPE vocabularies spell raw bytes as printable characters.

tokenizer.json and CTranslate2's vocabulary files store each token with every byte mapped to a
printable code point (space → 'Ġ', newline → 'Ċ', …); whisper.cpp's ggml files store the raw
bytes. These two functions translate between the spellings.
"""


def _table():
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


BYTE_TO_CHAR = _table()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def bytes_to_byte_level(raw: bytes) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in raw)


def byte_level_to_bytes(word: str) -> bytes:
    """A byte-level token back to raw bytes; characters outside the alphabet (as in special
    tokens like '<|en|>', which are plain ASCII anyway) are UTF-8 encoded."""
    out = bytearray()
    for ch in word:
        b = CHAR_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)
