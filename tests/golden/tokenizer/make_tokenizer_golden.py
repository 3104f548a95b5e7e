#!/usr/bin/env python3
"""Trains small DeepSeek-V3-style byte-level BPE tokenizers with Hugging Face `tokenizers`
and records what that library does with them, as goldens for moesh's C++ tokenizer
(common/tokenizer).  Nothing here is needed at build time; the outputs are committed under
tests/golden/tokenizer/ and this script documents (and can regenerate) them.

Usage (needs `tokenizers`; runs on CPU in well under a minute):

    python3 tests/golden/tokenizer/make_tokenizer_golden.py OUTDIR

Writes into OUTDIR (committed as tests/golden/tokenizer/<name>/tokenizer.json,
<name>/golden.json and unicode_classes.json):
  tokenizer_tiny.json      vocab 512, shipped by `moesh mkmodel --preset tiny`
  tokenizer_small.json     vocab 8192, shipped by `moesh mkmodel --preset small`
  tokenizer_nfc.json       vocab 512 test-only variant: NFC normalizer, the Split regex with
                           escaped \\r\\n, legacy "a b" merges, ignore_merges, a
                           Sequence(ByteLevel, TemplateProcessing) post-processor, more added
                           tokens (non-special, normalized, prefix-overlapping specials)
  golden_<name>.json       per tokenizer: encode cases (ids with/without special tokens, tokens,
                           decode with/without skip_special_tokens), decode-only cases (byte
                           tokens that split or break UTF-8, random id sequences, unknown ids)
                           and the pre-tokenizer's pieces for every encode text
  unicode_classes.json     the code points (ranges) that \\p{L} \\p{M} \\p{N} \\p{P} \\p{S} \\s
                           match in the library's regex engine (Oniguruma)

The tiny/small tokenizers use DeepSeek-V3's settings: normalizer Sequence([]), pre_tokenizer
Sequence(Split x3 Isolated, ByteLevel(add_prefix_space=False, use_regex=False)), decoder
ByteLevel, BPE without byte_fallback or unk, BOS <｜begin▁of▁sentence｜> (id 0) prepended by
a TemplateProcessing post-processor, EOS <｜end▁of▁sentence｜> (id 1).
"""

import json
import os
import random
import sys
import traceback

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
SPECIALS = [BOS, EOS, "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
            "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁sep｜>"]
P_DIGITS = "\\p{N}{1,3}"
P_CJK = "[一-龥぀-ゟ゠-ヿ]+"
# As DeepSeek-V3's tokenizer.json has it after JSON decoding: \r and \n are literal characters.
P_MAIN = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
          "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
P_MAIN_ESCAPED = P_MAIN.replace("\r", "\\r").replace("\n", "\\n")


def log(*a):
    print(*a, flush=True)


def splits(main):
    return [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
            for p in (P_DIGITS, P_CJK, main)]


# ------------------------------------------------------------------------------ corpora
TRAIN_TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's 9:45 a.m. on 2024-03-17, and the "
    "temperature is 21.5°C. Don't forget: we'll meet at Anne's house!",
    "Mixture-of-Experts models route each token to a few experts; the router's gate picks "
    "the top-k experts per token and the outputs are combined with the gate weights.",
    "def forward(self, x):\n    h = self.norm(x)\n    return x + self.attn(h)  # residual\n",
    "#include <vector>\nint main(int argc, char** argv) {\n\tstd::vector<int> v{1, 2, 3};\n"
    "\treturn v.size() > 2 ? 0 : 1;\n}\n",
    '{"name": "moesh", "version": [0, 1, 2], "ok": true, "ratio": 0.125}\n',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "深度求索发布了新的混合专家模型。我们在北京和杭州工作，今天天气很好！",
    "日本語のテキストです。ひらがなとカタカナ、そして漢字を使います。コンピューター",
    "Привет, мир! Это тестовый текст на русском языке. Ёжик в тумане.",
    "Καλημέρα κόσμε, αυτό είναι ένα ελληνικό κείμενο.",
    "Café, naïve, résumé, façade, jalapeño, Straße, Øresund, Ångström, crème brûlée.",
    "مرحبا بالعالم. هذا نص عربي قصير.", "שלום עולם, זהו טקסט בעברית.",
    "नमस्ते दुनिया, यह हिंदी पाठ है।", "สวัสดีชาวโลก", "안녕하세요 세계, 한국어 텍스트입니다.",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ.",
    "Emoji: 😀 😂 👍🏽 ❤️ 🎉 🚀 👨‍👩‍👧‍👦 🇺🇸 🇯🇵 🤖 🧑‍💻",
    "Numbers 0 1 12 123 1234 12345 3.14159 2,718 1e-9 0xFF 1_000_000 ٣٤٥ ５６７ ½ ² Ⅻ",
    "Whitespace:\ttabs\t\tand  double  spaces   and\n\nnewlines\r\nand trailing   \n",
    "Punctuation!!! What?? Yes... (maybe) [ok] {fine} <tag> \"quoted\" 'single' -- — … «»",
    "Markdown: # Title\n\n- item one\n- item two\n\n**bold** _italic_ `code` [link](http://x.y/z)",
]

SYLLABLES = {
    "en": ["th", "e", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of", "ed",
           "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
           "ve", "co", "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", "li", "ch"],
    "ru": ["ст", "но", "то", "на", "ен", "ов", "ни", "ра", "во", "ко", "ть", "пр", "ли", "ре"],
    "el": ["το", "αι", "να", "ου", "ει", "ης", "ον", "κα", "τη", "με", "πο", "λο"],
    "zh": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明"),
    "ja": list("あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー"),
    "fr": ["é", "è", "à", "ç", "ou", "le", "la", "de", "qu", "ai", "eu", "on", "ê", "ô", "û"],
}


def synthetic_corpus(seed, n_words):
    rng = random.Random(seed)
    out, line = [], []
    langs = list(SYLLABLES)
    for _ in range(n_words):
        lang = rng.choice(langs)
        word = "".join(rng.choice(SYLLABLES[lang]) for _ in range(rng.randint(1, 4)))
        r = rng.random()
        if r < 0.08:
            word = str(rng.randint(0, 10 ** rng.randint(1, 7)))
        elif r < 0.12:
            word = word.capitalize()
        elif r < 0.15:
            word += rng.choice([",", ".", "!", "?", ";", ":", "...", "'s", ")", "\"", "。", "，"])
        line.append(word)
        if rng.random() < 0.05:
            out.append(" ".join(line) + rng.choice(["\n", "\n\n", " \n", "\t\n"]))
            line = []
    out.append(" ".join(line))
    return out


TEST_TEXTS = [
    "", " ", "  ", "\n", "\t", "a", "Hello, world!", "Hello world.\n", "   leading spaces",
    "trailing spaces   ", "abc   123", "x = 1234567 + 89;", "1234567890", "12 345 6789",
    "3.14159265358979", "v1.2.3-rc4", "١٢٣٤٥٦٧", "１２３４５", "½ + ¾ = 1¼", "x² + y³", "Ⅻ Ⅳ", "〇一二三",
    "𝟘𝟙𝟚𝟛", "The year 2025 was good; 2026 will be better.",
    "It's don't won't y'all rock'n'roll", "foo.bar(baz)->qux::quux", "#include <stdio.h>",
    "if (a && b) { return -1; } else { return +1; }",
    "def f(x):\n    return x ** 2\n\n\nprint(f(3))\n", "\tindented\n\t\tdouble\n",
    "line1\r\nline2\r\n\r\nline4", "a  \n  b", "a \n\n b", "   \n   ", "\n\n\n", " \t \t ",
    "end with newline\n", "spaces before newline   \n", "x\u00a0y", "x\u3000y", "x\u2028y",
    "x\u0085y", "x\u000by\u000cz", "x\u200by", "\ufeffBOM", "\x00\x01\x1b[31mred\x1b[0m\x7f",
    "!!!???...", "Wait... what?!", " --> ", "...\n\n", "(a)[b]{c}<d>", "\"quoted\" 'single' `back`",
    "—dash– and … ellipsis", "«guillemets» „quotes“", "$100 €200 £300 ¥400", "©®™°±×÷",
    "→←↑↓ ∑∏√∞ ≤≥≠", "path/to/file.txt", "https://example.com/a?b=c&d=e#f",
    "user@example.com", "#hashtag @mention", "snake_case camelCase PascalCase",
    "ALL CAPS TEXT", "MiXeD cAsE", "中文测试，你好。", "深度求索DeepSeek模型", "龥龦",
    "日本語とカタカナ、ひらがな。", "コンピューター", "ｶﾀｶﾅ ﾊﾝｶｸ", "𠀀𠀁 CJK ext B",
    "한국어 텍스트", "Привет, мир!", "Ёлка и ёжик", "Καλημέρα", "مرحبا بالعالم", "שלום",
    "नमस्ते", "สวัสดี", "café naïve", "cafe\u0301 nai\u0308ve", "e\u0301\u0302\u0303",
    "\u0301abc", " \u0301", "a\u20dd", "ǅemal ʰaspirated", "Straße ß ẞ", "Ǆ ǅ ǆ",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸🇯🇵", "❤️‍🔥", "🧑‍💻 coding", "I ❤ Unicode", "emoji😀inside",
    "Ġ Ċ ĉ byte-level lookalikes", BOS + "Hello" + EOS, BOS, EOS, BOS + BOS, EOS + " " + EOS,
    "before" + BOS + "after", "<｜User｜>Hi<｜Assistant｜><think>\nhmm\n</think>Hello!",
    "<｜begin▁of", "sentence｜>", "<｜begin▁of▁sentence｜", "<think", "<think>>", "<<think>>",
    "<｜tool▁calls▁begin｜><｜tool▁sep｜>get_weather<｜tool▁calls▁end｜>", "▁▁▁", "｜",
    "<|x|>y <|x|>z <|x|<|x|>", "<e\u0301> <é> <e>", "[[raw]] [[ raw ]]",
    "a" * 300, " " * 100 + "x", "\n" * 50, "ab" * 100, "1" * 40, "中" * 60, "😀" * 20,
    "word " * 40, "Mixed 中文 and English and 日本語 and 123 and émojis 🎉!",
]


def fuzz_texts(seed, n):
    pool = (list("abcXYZ019 ") + [" ", "  ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u2028",
            "\u0085", "\x0b", "\x0c", "\u200b", "\u200d", "\ufeff", "\x00", "\x7f", "\x1b"]
            + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
            + ["…", "—", "「", "」", "，", "。", "、", "¡", "¿", "«", "»", "€", "£", "©", "°",
               "×", "→", "∑", "√", "∞", "٣", "۴", "५", "१", "１", "²", "½", "Ⅻ", "〇", "𝟙", "é",
               "ß", "ñ", "Ж", "я", "Ω", "λ", "ا", "ש", "न", "ि", "्", "ก", "ั", "한", "글", "中",
               "文", "龥", "龦", "日", "ひ", "ら", "カ", "ー", "ｶ", "ﾞ", "𠀀", "ǅ", "ʰ", "\u0301",
               "\u0308", "\u20dd", "\u0903", "😀", "👍", "🏽", "👨", "👩", "❤", "\ufe0f", "🇺",
               "🇸", "🤖", "Ġ", "Ċ", "▁", "｜", "<", ">", "<｜", "｜>", BOS, EOS, "<think>",
               "</think>", "<|x|>", "<|x|>y", "<e\u0301>", "[[raw]]", "the", " the", "ing",
               "123", "4567", " 89"])
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 24)):
            p = rng.choice(pool)
            parts.append(p * rng.randint(2, 5) if rng.random() < 0.1 else p)
        out.append("".join(parts))
    return out


# ------------------------------------------------------------------------------ building
def train(vocab_size, main_pattern, normalizer, corpus):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        splits(main_pattern) + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0, show_progress=False,
                                  special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)])
    return tok


def reload(tok, edit=None):
    d = json.loads(tok.to_str())
    if edit:
        edit(d)
    return Tokenizer.from_str(json.dumps(d, ensure_ascii=False))


def build_all():
    corpus = TRAIN_TEXTS * 20 + synthetic_corpus(7, 120000)
    out = {}
    for name, vocab in (("tiny", 512), ("small", 8192)):
        tok = train(vocab, P_MAIN, None, corpus)

        def deepseek_normalizer(d):
            d["normalizer"] = {"type": "Sequence", "normalizers": []}
        out[name] = reload(tok, deepseek_normalizer)
    tok = train(512, P_MAIN_ESCAPED, normalizers.NFC(), corpus)
    tok.add_special_tokens([AddedToken("<|x|>", special=True, normalized=False),
                            AddedToken("<|x|>y", special=True, normalized=False)])
    tok.add_tokens([AddedToken("<e\u0301>", special=False, normalized=True),
                    AddedToken("[[raw]]", special=False, normalized=False)])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
                                      special_tokens=[(BOS, bos_id)])])

    def legacy(d):
        d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
        d["model"]["ignore_merges"] = True
    out["nfc"] = reload(tok, legacy)
    return out


# ------------------------------------------------------------------------------ goldens
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def golden(tok, texts, seed):
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    enc = []
    for t in texts:
        a, b = tok.encode(t, add_special_tokens=False), tok.encode(t, add_special_tokens=True)
        enc.append({"text": t, "ids": a.ids, "ids_with_special": b.ids, "tokens": a.tokens,
                    "decode": tok.decode(b.ids, skip_special_tokens=False),
                    "decode_skip_special": tok.decode(b.ids, skip_special_tokens=True)})
    b2u = bytes_to_unicode()

    def byte_ids(bs):
        return [tok.token_to_id(b2u[b]) for b in bs]
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    zhong = list("中".encode())
    id_lists = [byte_ids([0xE4]), byte_ids([0xE4]) + byte_ids(b"a"), byte_ids([0xF0, 0x9F]),
                byte_ids([0xF0, 0x9F, 0x98]) + [eos], byte_ids([0xC0]), byte_ids([0xC1, 0x80]),
                byte_ids([0xED, 0xA0, 0x80]), byte_ids([0xF4, 0x90, 0x80, 0x80]), byte_ids([0xF5]),
                byte_ids([0x80]), byte_ids([0xFF, 0xFE]), byte_ids(zhong), byte_ids(zhong[:2]),
                byte_ids(zhong[:2]) + [bos] + byte_ids(zhong[2:]), byte_ids([0xE4, 0xB8, 0x41]),
                byte_ids(list("😀".encode())), byte_ids(list("😀".encode())[:3] * 2),
                [bos, eos], [bos] + tok.encode("Hi!").ids + [eos], [vocab_size + 5],
                [vocab_size + 5, bos] + byte_ids(b"ok"), [], byte_ids([0x00, 0x7F, 0x0A])]
    rng = random.Random(seed)
    for _ in range(200):
        id_lists.append([rng.randrange(vocab_size) for _ in range(rng.randint(1, 12))])
    dec = [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=False),
            "text_skip_special": tok.decode(ids, skip_special_tokens=True)} for ids in id_lists]
    pre = pre_tokenizers.Sequence(splits(P_MAIN))
    pieces = [{"text": t, "pieces": [p for p, _ in pre.pre_tokenize_str(t)]} for t in texts]
    return {"tokenizers_version": tokenizers.__version__, "vocab_size": vocab_size,
            "encode": enc, "decode": dec, "pretokenize": pieces}


def class_ranges(pattern):
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    gaps = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text)
    outside = set()
    for piece, _ in gaps:
        outside.update(map(ord, piece))
    ranges = []
    for c in cps:
        if c in outside:
            continue
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ranges


def dump(path, obj):
    with open(path, "w", encoding="ascii") as f:
        if isinstance(obj, dict):
            f.write("{\n")
            items = list(obj.items())
            for i, (k, v) in enumerate(items):
                if isinstance(v, list):
                    body = ",\n".join(json.dumps(x, ensure_ascii=True) for x in v)
                    f.write(f"{json.dumps(k)}: [\n{body}\n]")
                else:
                    f.write(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=True)}")
                f.write(",\n" if i + 1 < len(items) else "\n")
            f.write("}\n")


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    log("tokenizers", tokenizers.__version__)
    toks = build_all()
    texts = TEST_TEXTS + fuzz_texts(11, 400)
    ok = True
    for name, tok in toks.items():
        try:
            tok.save(os.path.join(out_dir, f"tokenizer_{name}.json"), pretty=True)
            again = Tokenizer.from_file(os.path.join(out_dir, f"tokenizer_{name}.json"))
            g = golden(tok, texts, 100 + len(name))
            for c in g["encode"]:
                assert again.encode(c["text"], add_special_tokens=True).ids == c["ids_with_special"]
            max_id = max(tok.get_vocab(with_added_tokens=True).values())
            log(name, "vocab_size", g["vocab_size"], "max id", max_id, "BOS", tok.token_to_id(BOS),
                "EOS", tok.token_to_id(EOS), "merges", len(json.loads(tok.to_str())["model"]["merges"]))
            roundtrip = sum(c["decode_skip_special"] == c["text"] for c in g["encode"])
            log(name, f"round trips {roundtrip}/{len(g['encode'])}")
            dump(os.path.join(out_dir, f"golden_{name}.json"), g)
        except Exception:
            ok = False
            traceback.print_exc()
    try:
        classes = {"tokenizers_version": tokenizers.__version__}
        for key, pat in (("L", "\\p{L}"), ("M", "\\p{M}"), ("N", "\\p{N}"), ("P", "\\p{P}"),
                         ("S", "\\p{S}"), ("s", "\\s")):
            classes[key] = class_ranges(pat)
            log("class", key, len(classes[key]), "ranges")
        dump(os.path.join(out_dir, "unicode_classes.json"), classes)
    except Exception:
        ok = False
        traceback.print_exc()
    for name, tok in toks.items():
        for t in ["Hello, world! 1234567", "中文 日本語 😀", BOS + "x" + EOS]:
            e = tok.encode(t)
            log(name, repr(t), e.ids, e.tokens)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
