"""The thresholds of the text-level checks: ``TextThresholds`` (each default says why it sits
where it does) and the default prompt-injection and special-token patterns it compiles.

Must NOT import: ``rsp_bench`` (the engine never depends on the harness), torch (the
harness and tests import this without a model), or any other module of this package.
Only stdlib.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

# Phrases from public prompt-injection and jailbreak corpora. They are matched on a
# normalised copy of the text (NFKC, lower case, whitespace collapsed) so full-width or
# line-broken variants still match. Each requires an instruction-like noun or a jailbreak
# term, so "ignore the previous result" in an ordinary prompt does not match.
DEFAULT_INJECTION_PATTERNS: tuple[str, ...] = (
    r"\b(?:ignore|disregard|forget|override)\s+(?:all\s+|any\s+|every\s+)?(?:of\s+)?"
    r"(?:the\s+|your\s+|my\s+|these\s+|those\s+|its\s+)?(?:previous|prior|above|earlier|preceding|"
    r"former|original|initial|foregoing|system|safety)\s+(?:instructions?|prompts?|directions?|"
    r"rules?|guidelines?|messages?|commands?|context|constraints?|directives?|restrictions?)",
    r"\b(?:ignore|disregard|forget)\s+(?:everything|all|anything)\s+(?:above|before|previously|"
    r"prior|you\s+(?:were|have\s+been)\s+told)",
    r"\bdisregard\s+(?:the\s+|all\s+|everything\s+)?(?:above|previous|prior)\b",
    r"\b(?:ignore|disregard|forget)\s+(?:all\s+)?(?:the\s+)?(?:text|content|messages?|lines?|words)\s+(?:above|before\s+this)\b",
    r"\b(?:you\s+are\s+)?no\s+longer\s+bound\s+by\b",
    r"\byou\s+are\s+now\s+(?:dan\b|in\s+developer\s+mode|jailbroken|unrestricted|unfiltered|"
    r"uncensored|free\s+(?:from|of)|no\s+longer\s+bound|an?\s+(?:unrestricted|unfiltered|"
    r"uncensored|evil|rogue))",
    r"\bdo\s+anything\s+now\b",
    r"\b(?:dan|developer|god|jailbreak|unrestricted)\s+mode\s+(?:is\s+)?(?:enabled|activated|on)\b",
    r"\b(?:new\s+)?system\s+prompt\s*:",
    r"\b(?:reveal|print|show|output|repeat|leak|display|dump)\s+(?:me\s+)?(?:your|the)\s+"
    r"(?:(?:full|entire|hidden|original|initial|secret|exact)\s+)*(?:system\s+prompt|hidden\s+"
    r"instructions|initial\s+instructions|original\s+instructions|instructions\s+above|initial\s+prompt|"
    r"original\s+prompt|hidden\s+prompt|secret\s+prompt)",
    r"\b(?:pretend|imagine)\s+(?:that\s+)?you\s+(?:are|have|were|had)\b[^.!?\n]{0,60}?\b(?:no|without)"
    r"\s+(?:any\s+)?(?:restrictions|filters|limitations|rules|guidelines|censorship|content\s+polic)",
    r"\bact\s+as\s+(?:an?\s+)?(?:ai|assistant|model|chatbot|llm|language\s+model)\b[^.!?\n]{0,40}?"
    r"\b(?:no|without)\s+(?:any\s+)?(?:restrictions|filters|limitations|rules|guidelines|censorship)",
    r"\bfrom\s+now\s+on,?\s+you\s+(?:will|are|must|shall)\s+(?:ignore|disregard|not\s+follow|"
    r"answer\s+without|respond\s+without)",
    # The same overrides in other languages (stop 54): "forget / ignore" with "all", "previous" or
    # "your" before the instructions or rules, "no rules / restrictions from now on", the hidden setup.
    r"\b(?:vergiss|vergesst|vergessen\s+sie|ignoriere|ignoriert|ignorieren\s+sie|missachte)\s+(?:bitte\s+)?"
    r"(?:alle|sämtliche|deine|ihre|die\s+(?:bisherigen|vorherigen|früheren))\s+(?:\w+\s+){0,2}"
    r"(?:anweisungen|regeln|vorgaben|instruktionen|richtlinien)",
    # "forget everything you were told before" (de, fr, es, it, pt)
    r"\bvergiss\s+alles,?\s+was\s+(?:man\s+)?dir\s+(?:\w+\s+)?gesagt|\boublie\s+tout\s+ce\s+qu'on\s+t'a\s+dit|"
    r"\bolvida\s+todo\s+lo\s+que\s+te\s+(?:dijeron|han\s+dicho)|\bdimentica\s+tutto\s+(?:quello\s+)?che\s+ti\s+"
    r"(?:hanno\s+detto|è\s+stato\s+detto)|\besque[çc]a\s+tudo\s+o\s+que\s+(?:lhe|te)\s+disseram",
    r"\b(?:keine\s+(?:regeln|einschränkungen|beschränkungen|filter)\s+mehr|ohne\s+(?:jede|alle|irgendwelche)\s+(?:einschränkungen|regeln|filter))\b",
    r"\b(?:oublie|oubliez|ignore|ignorez)\s+(?:toutes\s+|tous\s+)?(?:tes|vos|les\s+(?:consignes|instructions|règles)\s+"
    r"(?:précédentes|antérieures|reçues))|\b(?:oublie|oubliez|ignore|ignorez)\s+(?:toutes|tous)\s+les\s+"
    r"(?:consignes|instructions|règles|directives)",
    r"\b(?:sans\s+aucune\s+(?:restriction|règle|limite)|tes\s+instructions\s+cachées)",
    r"(?:\b(?:olvida|olvide|olviden)|(?:^|[.!?¡¿:;\x22«]\s*)(?:ignora|ignore|ignoren))\s+(?:todas\s+(?:las|tus|sus)|tus|sus|las\s+\w+\s+(?:anteriores|previas))\s+"
    r"(?:\w+\s+)?(?:instrucciones|reglas|normas|indicaciones)|\bolvida\s+todas\s+las\s+instrucciones|"
    r"\bolvida\s+lo\s+anterior\s+y\b|\btus?\s+(?:mensaje|prompt|instrucciones)\s+de(?:l)?\s+sistema\b",
    r"\b(?:no\s+tienes\s+ninguna\s+(?:norma|regla|restricci[oó]n)|sin\s+ninguna\s+restricci[oó]n)",
    r"(?:\b(?:dimentica|dimenticate)|(?:^|[.!?:;\x22«]\s*)(?:ignora|ignorate))\s+(?:tutte\s+le|le\s+tue|le\s+sue|le\s+\w+\s+precedenti)\s+(?:\w+\s+)?"
    r"(?:istruzioni|regole)",
    r"(?:\b(?:esqueça|esquece|esqueçam)|(?:^|[.!?:;\x22«]\s*)(?:ignore|ignora|ignorem))\s+(?:todas\s+as|as\s+suas|as\s+tuas|suas|tuas)\s+(?:\w+\s+)?"
    r"(?:instruções|regras)",
    r"\b(?:vergeet|negeer)\s+(?:al\s+)?(?:alle|je|jouw|uw|de\s+(?:eerdere|vorige))\s+(?:\w+\s+)?(?:instructies|regels)",
    r"(?:забудь|забудьте|игнорируй|игнорируйте|проигнорируй)\s+(?:все|свои|предыдущие|прежние)\s+(?:\w+\s+)?"
    r"(?:инструкции|правила|указания)|нет\s+никаких\s+правил|без\s+каких-либо\s+ограничений",
    r"(?:забудь|ігноруй|проігноруй)\s+(?:всі|усі|свої|попередні)\s+(?:\w+\s+)?(?:інструкції|правила|вказівки)",
    r"\b(?:zapomnij|zignoruj|ignoruj)\s+(?:o\s+)?(?:wszystkie|wszystkich|swoje|swoich|poprzednie|poprzednich)\s+(?:\w+\s+)?"
    r"(?:instrukcj|zasad|polece)",
    r"\b(?:önceki|tüm|bütün)\s+(?:talimatları|kuralları)\s+(?:unut|yok\s+say|görmezden\s+gel)",
    r"\b(?:abaikan|lupakan)\s+(?:semua\s+)?(?:instruksi|aturan)\s+(?:sebelumnya|sebelum\s+ini)|\bbỏ\s+qua\s+(?:tất\s+cả\s+)?"
    r"(?:các\s+)?(?:hướng\s+dẫn|chỉ\s+dẫn|quy\s+tắc)\s+(?:trước|trên)",
    r"(?:これまで|以前|前|上記)の(?:指示|命令|ルール|設定)(?:を|は)(?:すべて|全て)?(?:無視|忘れ|無効)|指示はすべて無効|"
    r"システムプロンプトを(?:表示|出力|教え)|制限なしで",
    r"(?:忽略|忘记|忘掉|无视|忽視|忘記)(?:之前|以前|以上|上面|所有|全部|先前)(?:的)?(?:所有)?(?:指令|指示|规则|規則|说明)|"
    r"(?:显示|输出|告诉我)(?:你的)?系统提示",
    r"(?:이전|모든|앞의)\s*(?:지시|명령|규칙|지침)(?:을|를|은|는)?\s*(?:모두\s*)?(?:무시|잊어)",
    r"تجاهل\s+(?:جميع|كل)\s+(?:التعليمات|الأوامر)|पिछले\s+(?:सभी\s+)?निर्देशों\s+को\s+(?:भूल|अनदेखा)",
    # Stop 55 (12-06d's misses and their neighbours): Swedish, Danish, Norwegian, Czech, Slovak, Turkish,
    # Indonesian and Malay, Vietnamese, Finnish, Hungarian, Romanian, Greek, Hebrew, Persian; the rules
    # forgotten, or the model's own hidden setup asked for ("your hidden instructions", "your system prompt").
    r"\b(?:ignorera|glöm|strunta\s+i|ignorer|glem|ignorér)\s+(?:alla|alle|dina|dine|de\s+tidigare|tidigare|tidligere)\s+"
    r"(?:\w+\s+)?(?:instruktioner|instruksjoner|instrukser|regler|regeln|anvisningar)",
    r"\b(?:dina|dine)\s+(?:dolda|hemliga|skjulte|hemmelige)\s+(?:instruktioner|instruksjoner|regler)|\bdin\s+systemprompt",
    r"\b(?:ignoruj(?:te)?|zapome[nň](?:te)?|ignoruj|zabudni(?:te)?)\s+(?:na\s+)?(?:všechn[ay]|všetk[ya]|svoje|své|předchozí|"
    r"predchádzajúce)\s+(?:\w+\s+)?(?:pokyny|instrukce|pravidla|inštrukcie|pravidlá|omezení)",
    r"\b(?:svůj|váš|tvůj|svoj)\s+(?:celý\s+)?systémový\s+prompt|\bvypínám\s+všechna\s+(?:vaše\s+|tvá\s+)?omezení",
    r"\b(?:önceki|tüm|bütün)\s+(?:\w+\s+)?(?:talimat|kural)\w*\s+(?:\w+\s+)?(?:unut|yok\s+say|görmezden\s+gel)|"
    r"\b(?:sana\s+verilen\s+)?gizli\s+talimat\w*|\bsistem\s+(?:istemini|talimatlarını)",
    r"\b(?:abaikan|lupakan)\s+(?:semua|seluruh)\s+(?:\w+\s+)?(?:instruksi|aturan|batasan|perintah)|"
    r"\b(?:semua|seluruh)\s+batasan\s+(?:\w+\s+)?(?:dimatikan|dinonaktifkan|dicabut)|\binstruksi\s+sistem\s+(?:kamu|anda|mu)\b|"
    r"\b(?:tampilkan|tunjukkan|tuliskan)\s+(?:seluruh\s+|semua\s+)?(?:instruksi|prompt)\s+sistem",
    r"\bbỏ\s+qua\s+(?:tất\s+cả|mọi)\s+(?:các\s+)?(?:hướng\s+dẫn|chỉ\s+dẫn|quy\s+tắc|chỉ\s+thị)|\blời\s+nhắc\s+hệ\s+thống",
    r"\b(?:unohda|ohita)\s+(?:kaikki\s+)?(?:aiemmat\s+|edelliset\s+)?(?:ohjeet|säännöt|ohjeesi|sääntösi)|"
    r"\bfelejtsd\s+el\s+(?:az\s+összes|minden)\s+(?:\w+\s+)?(?:utasítás|szabály)|"
    r"\b(?:ignoră|ignora|uită)\s+(?:toate\s+)?(?:instrucțiunile|regulile)\s+(?:anterioare|de\s+mai\s+sus)|"
    r"(?:αγνόησε|ξέχασε)\s+(?:όλ(?:ες|ους)\s+)?(?:τις\s+|τους\s+)?(?:προηγούμενες\s+|προηγούμενους\s+)?(?:οδηγίες|κανόνες)|"
    r"(?:התעלם|שכח)\s+מ(?:כל\s+)?ה(?:הוראות|כללים)|(?:همه|تمام)\s+(?:دستورالعمل|قوانین|دستورات)\S*\s+(?:قبلی\s+)?را\s+(?:نادیده|فراموش)",
    # "your system prompt" in more languages (a developer asking about prompts writes "a" or "the")
    r"\b(?:dein(?:en)?|ihr(?:en)?)\s+systemprompt|\b(?:ton|votre)\s+(?:prompt|invite)\s+système|\bil\s+tuo\s+prompt\s+di\s+sistema|"
    r"\bo\s+seu\s+prompt\s+(?:do|de)\s+sistema|\bje\s+systeemprompt|\btwój\s+prompt\s+systemowy|\bсвой\s+системный\s+промпт",
    # Stop 56 (12-06e's and 12-06f's misses and their neighbours): "your hidden / system instructions" in the
    # second person, filters switched off
    r"\b(?:свої|твої|ваші)\s+(?:\w+\s+)?(?:приховані|системні|таємні|секретні)\s+(?:\w+\s+)?інструкції|"
    r"\b(?:свои|твои|ваши)\s+(?:\w+\s+)?(?:скрытые|системные|секретные|тайные)\s+(?:\w+\s+)?инструкции",
    r"\btus\s+instrucciones\s+(?:ocultas|secretas|del\s+sistema)|\bvos\s+instructions\s+(?:cachées|secrètes|système)|"
    r"\bdeinen?\s+(?:versteckten|geheimen)\s+(?:anweisungen|regeln|instruktionen)|\ble\s+tue\s+istruzioni\s+(?:nascoste|segrete|di\s+sistema)|"
    r"\b(?:suas|tuas)\s+instruções\s+(?:ocultas|secretas|do\s+sistema)",
    r"κρυφ\w*\s+οδηγ\w*\s+που\s+σου|\b(?:afișează|arată|scrie)\s+(?:\w+\s+)?instrucțiunile\s+(?:de\s+)?sistem|"
    r"\bdezactivat\s+filtrele\s+(?:tale|voastre)|\barahan\s+sistem\s+(?:anda|kamu|awak)\b",
)

# Chat-template control strings typed as plain text. Some tokenizers map them to real
# special tokens, which puts role switches in the middle of a user prompt.
DEFAULT_SPECIAL_TOKEN_PATTERNS: tuple[str, ...] = (
    r"<\|(?:im_start|im_end|endoftext|begin_of_text|end_of_text|eot_id|start_header_id|"
    r"end_header_id|system|user|assistant|end)\|>",
    r"\[/?inst\]",
    r"<</?sys>>",
    # Gemma's turns; gpt-oss's harmony format; Llama 3.1's tool call (stop 54)
    r"<(?:start|end)_of_turn>",
    r"<\|(?:start|message|channel|return|call|constrain)\|>",
    r"<\|(?:eom_id|python_tag)\|>",
)



def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"TextThresholds.{name} must be an integer >= 0, got {value!r}")


def _check_rate(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"TextThresholds.{name} must be a number in [0, 1], got {value!r}")


@dataclass(frozen=True)
class TextThresholds:
    """Thresholds of the text-level checks; each default says why it sits where it does.

    ``*_max`` fields are counts that may be present without firing (0: any one fires);
    ``*_run`` fields are run lengths that fire; ``*_rate`` fields are fractions that fire
    when exceeded, and only once the matching ``*_min`` count is reached so that one odd
    character in a three-character prompt is not a 33% rate.
    """

    # Cc characters other than \t \n \r (NUL, ESC, BEL, DEL, C1 controls): no ordinary
    # prompt contains one; they come from binary data, terminal escapes or broken decoding.
    control_max: int = 0
    # U+FFFD means bytes were already lost in decoding: the prompt is corrupted.
    replacement_max: int = 0
    # Noncharacters (U+FFFE, U+FFFF, U+FDD0..FDEF, ...) are never valid in interchange.
    noncharacter_max: int = 0
    # Explicit direction embeddings, overrides and isolates (U+202A..202E, U+2066..2069):
    # the "Trojan Source" trick; ordinary right-to-left text does not need them.
    bidi_override_max: int = 0
    # Invisible characters (ZWSP, word joiner, BOM past the start, invisible math operators,
    # tag characters, Hangul fillers, variation-selector runs, ZWJ/ZWNJ outside the scripts
    # and emoji sequences that use them): a classic way to hide text from a filter.
    zero_width_max: int = 0
    # Implicit direction marks (LRM, RLM, ALM) are legitimate in Arabic and Hebrew text, so
    # only a flood fires: more than this fraction of letters, and at least the min count.
    bidi_mark_rate: float = 0.10
    bidi_mark_min: int = 5
    # Private-use and unassigned code points: one icon-font glyph is plausible, three is
    # not. Emoji newer than Python's Unicode tables are not counted (see _is_emoji).
    unassigned_max: int = 2
    # Combining marks stacked on one base. Real orthographies stack at most about four
    # (Biblical Hebrew with cantillation, Tibetan subjoined letters); "Zalgo" text stacks
    # five to dozens.
    combining_stack_run: int = 5
    # The same on letters of scripts that carry few marks after NFC (Latin, Greek, Cyrillic,
    # CJK, ...): Yoruba or Lithuanian leave one uncomposable mark on a letter, two is rare.
    foreign_stack_run: int = 3
    # Marks on such letters (or on no letter at all) above this fraction of those letters,
    # with at least ``combining_min`` of them, drawn from more than ``combining_kinds_max``
    # different marks. NFC first, so decomposed French or Vietnamese counts nothing; Yoruba
    # keeps a mark on a third of its letters but uses three or four kinds (grave, acute,
    # macron), and statistics notation (x-bar, p-hat) stays far under 10%. Zalgo text draws
    # from the ~110 marks of U+0300-036F.
    # The kinds condition is waived when the marks are not the common orthographic ones
    # (acute, grave, circumflex, tilde, macron, breve, dots, ring, caron, cedilla, ogonek,
    # dot below, ...): ``combining_min`` unusual marks above the rate fire on their own.
    combining_rate: float = 0.10
    combining_min: int = 3
    combining_kinds_max: int = 4
    # Mojibake: UTF-8 bytes read as Windows-1252 or Latin-1 ("cafÃ©", "itâ€™s"). Each sequence
    # is a character pair or triple that is one UTF-8 character once encoded back; a single one
    # can be a typo or a quoted example ("why does Ã© show up?"), so it takes this many. No
    # language writes such pairs: 0 of the 1,373 normal items (every fixtures/normal_corpus
    # part, the suites' prompts, SQuAD, structured) hold even one (tests/test_degradation_text.py).
    mojibake_min: int = 3
    # A run of one punctuation or symbol character. Code reaches `)))))` (5-8), prose "!!!"
    # or "...", so 12 is already abnormal.
    punctuation_run: int = 12
    # Separator characters (- = _ * # ~ ^ . + / | and box drawing) legitimately form long
    # lines: markdown rules and tables, comment banners, ASCII tables, progress bars, dot
    # leaders. A run of them is allowed up to this length when it stands like a separator
    # (bounded by line ends, spaces or table/comment characters, on a line with little else)
    # and the text has letters or digits to separate; a prompt that is only a run fires.
    separator_run_max: int = 120
    # A run of any punctuation, symbol or emoji on a line of nothing but it, separators and
    # spaces (a rule, a table border, a reStructuredText underline, an emoji banner) may be
    # as wide as a wide grid table, when the text has letters or digits elsewhere.
    separator_line_run_max: int = 400
    # Other content allowed on the line of an allowed separator run ("# ---- Setup ----",
    # "Chapter 1 ........ 12"); prose beside a run means the run was pasted into text.
    separator_line_other_max: int = 60
    # A separator run touching a letter, digit or other punctuation is pasted into text, except
    # where it touches another separator (a diffstat's "+++---", a "^---^" underline) or its line
    # is a delimited row with at least this many "|" (guitar and drum tablature "G|--7-5--|", a
    # hexdump's text column "|.ELF....|", HL7 fields "MED||||"). 0: rows get nothing. Stop 60:
    # these were 12 of the 13 data requests of the development splits that degraded as
    # punctuation runs (music notation 9), and no odd item of them was caught by such a run alone.
    separator_row_pipes_min: int = 2
    # A run of one letter, digit, emoji or other character. Ordinary text has "zzz" or
    # "hahaha"; a hex literal can reach 64 zeros (a 256-bit hash), which is exempted.
    char_run: int = 24
    # Whitespace runs: deep indentation and aligned columns reach 60-100 spaces.
    whitespace_run: int = 256
    # Emoji: a chat line with a few emoji is normal ("Happy birthday! 🎂🎉🎈" is 3/19).
    # Fires above 20% of visible characters with at least 8 emoji, or above 50% with 3.
    emoji_rate: float = 0.20
    emoji_min: int = 8
    emoji_dominant_rate: float = 0.50
    emoji_dominant_min: int = 3
    # Scripts inside one word. Japanese (kanji + kana) and Korean (hangul + hanja) count as
    # one group, words split where CJK meets other letters, and Latin + Greek is allowed
    # (kΩ, sinθ): so no ordinary word has three groups.
    script_groups_per_word_max: int = 2
    # Words mixing two script groups (other than Latin + Greek): homoglyph spoofing such as
    # a Cyrillic "а" in "pаypal". One can be a typo; several, over 10% of words, is a pattern.
    mixed_word_min: int = 2
    mixed_word_rate: float = 0.10
    # ... or when mixed words are most of the words, however few (a short prompt such as
    # a lone spoofed "pаypal", or a two-word string of random scripts).
    mixed_word_dominant_rate: float = 0.50
    # Script switches between consecutive letters, per letter, ignoring Latin<->CJK (CJK text
    # embeds English terms without spaces) and Latin<->Greek (math). A translation prompt
    # with six languages stays under 0.15; random letters from many scripts are near 0.8.
    script_switch_rate: float = 0.30
    script_min_letters: int = 8
    # The same across words: words of three or more scripts, where over half the time a word's
    # script differs from the one before it with only spaces between (a salad of words or random
    # tokens from many scripts). Punctuation or a line break between two words does not count, so
    # a glossary ("window: окно, Fenster, 窓") or a sentence quoting a foreign word stays clear.
    # Chosen on the development splits and the normal corpus (2026-12-04): no normal, data-request
    # or other-language item there has words of three scripts, and the odd multi-script kinds sit
    # at 0.6-1.0 (a space-separated four-language word list with line breaks: 0.47).
    word_script_min_words: int = 8
    word_script_groups_min: int = 3
    word_script_switch_rate: float = 0.50
    # A run of mixed punctuation without spaces or letters ("?!@#$%^&*..."): fires at this
    # length with at least ``mixed_punctuation_other_min`` non-separator characters in it.
    # Code packs 6-10 (`"]))});`) and regex-heavy code 20-40 (a string-literal pattern such
    # as `'"(\\\\|\\[^\\]|[^"\\])*"',`), so only longer soups fire here; a prompt that
    # is mostly punctuation is caught by the flood rule below.
    mixed_punctuation_run: int = 48
    mixed_punctuation_other_min: int = 32
    # Punctuation and symbols (not emoji) as a fraction of the visible characters, with at
    # least ``punctuation_flood_min`` of them and ``punctuation_flood_other_min`` that are
    # not separators (so a bare markdown table border is left to the separator rule).
    # Code and JSON stay under about 0.70; random symbol strings are near 1.
    punctuation_flood_rate: float = 0.80
    punctuation_flood_min: int = 12
    punctuation_flood_other_min: int = 4
    # A passage repeated verbatim (a paragraph pasted twice, a phrase looped): the share of a
    # prompt's words that lie in a run of ``repeat_ngram`` words that occurs at least twice, inside
    # a stretch of at least twice that many words with only spaces, plain punctuation and quotes
    # between them. A digit or a symbol ends a stretch, so log lines, CSV rows and JSON records
    # (the same message or field names on every line, between timestamps or values) never count.
    # Chosen on the development splits and the normal corpus (2026-12-04, 4,565 items): at 0.8 no
    # normal, data-request, payload or other-language item fires, and 47 odd ones do (every
    # doubled paragraph, looped phrase and repeated sentence); at 0.6 one normal request (a file
    # to review whose list repeats an eight-word description) fires at 0.74.
    repeat_ngram: int = 8
    repeat_min_words: int = 24
    repeat_share: float = 0.80
    # Running text set one word per line (a sentence "stacked" vertically): at least
    # ``stacked_min_lines`` non-empty lines, every one a single word (quotes and trailing
    # punctuation allowed), and words coming back (``stacked_repeat_share`` of the lines repeat an
    # earlier line's word, casefolded): running text repeats its function words, a list of items
    # (the top-level domains, names to sort, a vocabulary) mostly does not. A request around such
    # a list ("Sort these:") is a line of several words, so the rule never fires on it. Chosen on
    # the seven development splits and the normal corpus (2026-12-05, 5,267 items): 16 odd items
    # fire (every stacked sentence of the splits, and a word repeated on every line), no normal, data-request, payload or
    # other-language item; without the repeat condition one normal item (a list of top-level
    # domains) fires.
    stacked_min_lines: int = 12
    stacked_repeat_share: float = 0.05
    # One line growing a little at a time (``text_rules.growing_lines``): at least
    # ``growing_min_pairs`` neighbouring lines, and ``growing_share`` of all, where a line is the one
    # before it with more after it. Chosen on the nine development splits and the normal corpus
    # (2026-12-05, 6,688 items): the 5 cumulative-prefix texts fire, nothing else.
    growing_min_pairs: int = 5
    growing_share: float = 0.6
    # Letters drawn evenly from a script's alphabet (``text_rules.even_letters``): a script other
    # than Latin and CJK with at least ``even_letters_min`` letters in the prompt whose effective
    # number of letters (1 / the chance two are the same; a Hangul syllable counted as its jamo) is
    # at least ``even_letters_effective``. Chosen on the nine development splits and the normal
    # corpus (2026-12-05, 6,688 items): real text in 30 scripts stays at or under 34.5 (Korean
    # jamo; most scripts under 30), jumbles of Hangul, Devanagari, Thai, Georgian, Armenian,
    # runic or syllabic letters reach 38-3,000.
    even_letters_min: int = 48
    even_letters_effective: float = 38.0
    # Instructions planted in content for the model (``embedded_instructions``): this many cue
    # families, one of them an intent family (rules set aside, authority claimed, secrecy
    # demanded, data sent out), fire; so do a decisive cue and an order to the model after some
    # content. 0 turns the rule off. Chosen on the development text (2026-12-06, 12,285 items with
    # 12-05g): at 2, 63 odd items fire and no normal, data-request, payload or other-language item does;
    # version 3 with 12-06b (11,292 split and corpus items): 115 odd items, nothing else; version 4 with
    # 12-06c (12,023): 165 odd items, nothing else.
    embedded_min_families: int = 2
    # A word spelled out letter by letter ("b.u.i.l.d", "s-i-l-e-n-c-e-r": ``word_shapes.spelled_out``)
    # with at least this many different letters; 0 turns it off. Chosen on the text of every
    # reported split and the normal corpus (2026-12-07, 22,988 items): 5 odd items fire (every
    # hyphen- or dot-spelled banned word), nothing else; at 1 drum tabs ("x-x-x-x") and Java's
    # abbreviated packages ("o.a.c.c.C") in 3 data requests would.
    spelled_min_distinct: int = 4
    # Every word tagged (``word_shapes.tagged_words``): at least ``tagged_min_words`` tokens, and
    # ``tagged_share`` of them a word with a short bracketed tag ("keeps(5)"). Same text: 8 odd items
    # fire (word lengths or positions in brackets), nothing else. 0 words turns it off.
    tagged_min_words: int = 12
    tagged_share: float = 0.6
    # Prose in a container with no request around it (``containers.prose_in_container``): at
    # least ``container_min_spans`` string literals or text nodes holding a six-word run of prose,
    # ``container_min_words`` prose words in them, ``container_share`` of all the prompt's words,
    # and no line outside them that a person wrote (module docstring). 0 spans turns it off. Same
    # text: 142 odd items fire, 21 payloads without their request, and no data request, plain
    # request or normal item. One span would catch 16 more odd items and still nothing else there,
    # but a request pasted whole in quotes is one span of prose with nothing around it; at share
    # 0.3 a data request fires, at 0.7 only 92 odd items do.
    container_min_spans: int = 2
    container_min_words: int = 16
    container_share: float = 0.5
    injection_patterns: tuple[str, ...] = DEFAULT_INJECTION_PATTERNS
    special_token_patterns: tuple[str, ...] = DEFAULT_SPECIAL_TOKEN_PATTERNS
    _compiled: tuple[tuple[re.Pattern[str], ...], tuple[re.Pattern[str], ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for name in (
            "control_max", "replacement_max", "noncharacter_max", "bidi_override_max",
            "zero_width_max", "bidi_mark_min", "unassigned_max", "combining_min", "mojibake_min",
            "emoji_min", "emoji_dominant_min", "mixed_word_min", "script_min_letters", "word_script_min_words",
            "punctuation_flood_min", "punctuation_flood_other_min", "separator_line_other_max", "separator_row_pipes_min",
            "mixed_punctuation_other_min", "repeat_min_words", "stacked_min_lines", "even_letters_min",
            "growing_min_pairs", "embedded_min_families", "spelled_min_distinct", "tagged_min_words",
            "container_min_spans", "container_min_words",
        ):
            _check_count(name, getattr(self, name))
        for name in (
            "combining_stack_run", "foreign_stack_run", "combining_kinds_max",
            "punctuation_run", "separator_run_max",
            "separator_line_run_max", "char_run", "mixed_punctuation_run",
            "whitespace_run", "script_groups_per_word_max", "word_script_groups_min", "repeat_ngram",
        ):
            value = getattr(self, name)
            _check_count(name, value)
            if value < 1:
                raise ValueError(f"TextThresholds.{name} must be >= 1, got {value!r}")
        for name in (
            "bidi_mark_rate", "combining_rate", "emoji_rate", "emoji_dominant_rate",
            "mixed_word_rate", "mixed_word_dominant_rate", "script_switch_rate", "word_script_switch_rate",
            "punctuation_flood_rate", "repeat_share", "stacked_repeat_share", "growing_share",
            "tagged_share", "container_share",
        ):
            _check_rate(name, getattr(self, name))
        e = self.even_letters_effective
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e) or e < 2:
            raise ValueError(f"TextThresholds.even_letters_effective must be a finite number >= 2, got {e!r}")
        compiled = []
        for name in ("injection_patterns", "special_token_patterns"):
            patterns = getattr(self, name)
            if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
                raise ValueError(f"TextThresholds.{name} must be a tuple of regex strings, got {patterns!r}")
            group = []
            for p in patterns:
                try:
                    group.append(re.compile(p, re.IGNORECASE | re.DOTALL))
                except re.error as exc:
                    raise ValueError(f"TextThresholds.{name}: bad regex {p!r}: {exc}") from None
            compiled.append(tuple(group))
        # frozen dataclass: the compiled patterns are a cache derived from the fields.
        object.__setattr__(self, "_compiled", (compiled[0], compiled[1]))
