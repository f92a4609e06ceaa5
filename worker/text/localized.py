"""Dates, times and signs in the languages other than English (Spanish `e`, French `f`, Italian `i`,
Portuguese `p`, Hindi `h`, read by espeak-ng; Mandarin `z` and Japanese `j`, read by misaki's
readers after cn2an; worker/text/g2p.py).

Those readers say the numbers well, so a number stays a number here. What they read badly is what
is around them: a sign alone is no word to them and is silent ("al 50%" came out "al cinquanta",
"$20です" "nijuu desu"), a date is read with its slashes ("tres barra cuatro barra dos mil
veinticinco"; cn2an made "2025/4" a fraction) and French "14h30" with the letter h ("quatorze ache
trente"). So, before them:

    "Cuesta 25,50 € (50%)."     -> "Cuesta 25,50 euros (50 por ciento)."
    "el 3/4/2025 a las 14:30"   -> "el 3 de abril de 2025 a las 14 y 30"
    "le 01/04/2025 à 14h30"     -> "le premier avril 2025 à 14 heures 30"
    "cuesta $1,000.50"          -> "cuesta 1000,50 dólares"
    "2025/4/3 14:30、$20"        -> "2025年4月3日 14点30分、20美元" (Mandarin; Japanese じゅうよじさんじゅっぷん、20ドル)

Dates are day first in the languages that write them so, year first in Mandarin and Japanese, and
only with a year: "3/4" alone may be a fraction. Times are read as people say a clock in each
language, the hour then the minutes.
"""

from __future__ import annotations

import re

from worker.text.source_map import MappedText, plain_or_mapped

LANGUAGES = ("e", "f", "i", "p", "h", "z", "j")
_YEAR_FIRST = ("z", "j")

# Each sign's words: (singular, plural), said after the amount.
_SIGNS = {
    "e": {"%": ("por ciento", "por ciento"), "€": ("euro", "euros"), "$": ("dólar", "dólares"),
          "£": ("libra", "libras"), "R$": ("real", "reales"), "₹": ("rupia", "rupias"), "¥": ("yen", "yenes")},
    "f": {"%": ("pour cent", "pour cent"), "€": ("euro", "euros"), "$": ("dollar", "dollars"),
          "£": ("livre", "livres"), "R$": ("réal", "réais"), "₹": ("roupie", "roupies"), "¥": ("yen", "yens")},
    "i": {"%": ("per cento", "per cento"), "€": ("euro", "euro"), "$": ("dollaro", "dollari"),
          "£": ("sterlina", "sterline"), "R$": ("real", "real"), "₹": ("rupia", "rupie"), "¥": ("yen", "yen")},
    "p": {"%": ("por cento", "por cento"), "€": ("euro", "euros"), "$": ("dólar", "dólares"),
          "£": ("libra", "libras"), "R$": ("real", "reais"), "₹": ("rupia", "rupias"), "¥": ("iene", "ienes")},
    "h": {"%": ("प्रतिशत", "प्रतिशत"), "€": ("यूरो", "यूरो"), "$": ("डॉलर", "डॉलर"), "£": ("पाउंड", "पाउंड"),
          "R$": ("रियाल", "रियाल"), "₹": ("रुपया", "रुपये"), "¥": ("येन", "येन")},
    # Mandarin's percent is cn2an's (百分之五十: the word comes first there)
    "z": {"€": ("欧元", "欧元"), "$": ("美元", "美元"), "£": ("英镑", "英镑"), "R$": ("雷亚尔", "雷亚尔"),
          "₹": ("卢比", "卢比"), "¥": ("元", "元"), "￥": ("元", "元")},
    "j": {"%": ("パーセント", "パーセント"), "€": ("ユーロ", "ユーロ"), "$": ("ドル", "ドル"), "£": ("ポンド", "ポンド"),
          "R$": ("レアル", "レアル"), "₹": ("ルピー", "ルピー"), "¥": ("円", "円"), "￥": ("円", "円")},
}
_AMOUNT = r"\d+(?:[.,\s]\d{3})*(?:[.,]\d+)?"
_FULLWIDTH_SEPARATOR = re.compile(r"(?<=\d)[，．](?=\d)")
_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_SIGN_BEFORE = re.compile(r"(?P<sign>R\$|US\$|[$€£₹¥￥])\s?(?P<n>" + _AMOUNT + r")")
_SIGN_AFTER = re.compile(r"(?<![\d.,])(?P<n>" + _AMOUNT + r")\s?(?P<sign>R\$|[%€£₹¥￥$])")

_MONTHS = {
    "e": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre",
    "f": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre",
    "i": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre dicembre",
    "p": "janeiro fevereiro março abril maio junho julho agosto setembro outubro novembro dezembro",
    "h": "जनवरी फ़रवरी मार्च अप्रैल मई जून जुलाई अगस्त सितंबर अक्टूबर नवंबर दिसंबर",
}
_DATE_FORMAT = {"e": "{d} de {month} de {y}", "f": "{d} {month} {y}", "i": "{d} {month} {y}",
                "p": "{d} de {month} de {y}", "h": "{d} {month} {y}", "z": "{y}年{m}月{d}日", "j": "{y}年{m}月{d}日"}
_FIRST_DAY = {"f": "premier", "i": "primo", "p": "primeiro"}  # "le premier avril", not "le un avril"
_DATE = re.compile(r"(?<![\d/.-])(?P<d>\d{1,2})(?P<sep>[/.-])(?P<m>\d{1,2})(?P=sep)(?P<y>\d{4}|\d{2})(?![\d/.-]|[.,]\d)")
_YEAR_FIRST_DATE = re.compile(r"(?<![\d/.-])(?P<y>\d{4})(?P<sep>[/.-])(?P<m>\d{1,2})(?P=sep)(?P<d>\d{1,2})(?![\d/.-]|[.,]\d)")

# Japanese phone numbers ("03-1234-5678", "09012345678"), digit by digit as they are said, the
# groups apart; misaki would read each group as an amount ("san sen nihyaku...").
_JA_PHONE = re.compile(r"(?<![\d-])\d{2,4}-\d{2,4}-\d{3,4}(?![\d-])|(?<![\d.,])0\d{9,10}(?![\d.,])")
_JA_DIGITS = ("ゼロ", "イチ", "ニー", "サン", "ヨン", "ゴー", "ロク", "ナナ", "ハチ", "キュー")
# misaki reads a number of at most 9 digits; a longer one came out as its error message ("Number
# length too long, choose less than 10 digits") in English phonemes. An amount (a unit after it, or
# thousands commas) is said in 万, 億 and 兆; any other long run, and a run with a leading 0, is a
# code or an ID, read digit by digit.
_JA_AMOUNT = re.compile(r"(?<![\d.,])[1-9]\d{9,15}(?=\s?(?:円|ドル|ユーロ|ポンド|レアル|ルピー|元|人|件|個|台|株|票|枚|本|回|倍))")
_JA_CODE = re.compile(r"(?<![\d.,])(?:\d{10,}|0\d+)(?![\d.]|,\d)")
# A number from 100 up is given to misaki in kanji: its own reading of the digits splits 百 after
# 3, 6 and 8 ("300" 'saɴ bʲija kɯ', "800" 'haʔpʲi ja kɯ', not 'sambʲakɯ', 'haʔpʲakɯ') and cuts a
# round 万 from the word after it ("50000人" 'ɡoma ɴ çito', "五万人" 'ɡo maɲɲiɴ'). Below 100 the digits
# stay: there its dictionary reads some counters better from digits ("3本"; "三本" is a surname).
_JA_NUMBER = re.compile(r"(?<![\d.,])[1-9]\d{2,8}(?![\d.]|,\d)")
# Below 100, before the counters of dates, clock times and people, whose kanji misaki reads as they
# are said and whose digits it does not: 2月 'ɲi ʦɨkʲi' (二月 'ɲiɡaʦɨ'), 12時 'ʥɨːɲi tokʲi', 3日 'saɴ ɲiʨi'
# (三日 'mʲiʔka'), 2人 'ɲi çito' (二人 'ɸɯtaɾʲi'), 5分 'ɡo bɯɴ' (五分 'ɡo ɸɯɴ'; but 30分の1 is a fraction).
_JA_COUNTED = re.compile(r"(?<![\d.,])(?P<n>[1-9]\d?)(?P<counter>[月時日人]|分(?!の))(?P<span>(?<=[時日分])間)?")
# Where misaki's reading of the kanji is wrong too, the reading in kana, by the number's last digit
# (after the tens: 14日 じゅうよっか): 四月 'joŋɡaʦɨ' for shigatsu, 九時 'kʲɨːʥi' for kuji, 四日
# 'joŋka' for yokka, 二日 'ɸɯtaka' for futsuka, 四人 'joɴɲiɴ' for yonin, 三分 'saɴ ɸɯɴ' for sanpun.
# Read from kana, misaki says each as it is said. 間 after 時, 日 and 分 (a span: 4時間) is said かん.
_JA_TENS_KANA = ("", "じゅう", "にじゅう", "さんじゅう", "よんじゅう", "ごじゅう", "ろくじゅう", "ななじゅう", "はちじゅう",
                 "きゅうじゅう")
_JA_COUNTED_KANA = {
    "月": {4: "しがつ", 7: "しちがつ", 9: "くがつ"},
    "時": {4: "よじ", 7: "しちじ", 9: "くじ"},
    "日": {4: "よっか", 7: "しちにち", 9: "くにち"},
    "人": {4: "よにん"},
    # 8 in katakana: misaki takes the は of じゅうはっぷん for the particle ('ʥɨːβaʔpɯɴ')
    "分": {1: "いっぷん", 3: "さんぷん", 4: "よんぷん", 6: "ろっぷん", 8: "ハップン", 0: "っぷん"},
}
_JA_FIRST_DAYS = {2: "ふつか", 4: "よっか", 7: "なのか"}  # of 1-9日, those misaki reads wrong (9日 kokonoka is right)


def _ja_counted(m: re.Match) -> str:
    n, counter, span = int(m.group("n")), m.group("counter"), "かん" if m.group("span") else ""
    tens, last = divmod(n, 10)
    if counter == "日" and n in _JA_FIRST_DAYS:
        return _JA_FIRST_DAYS[n] + span
    said = _JA_COUNTED_KANA[counter].get(last)
    if said is None or (counter == "月" and n > 12) or (counter == "日" and n < 10):
        return _ja_kanji(m.group("n")) + counter + (m.group("span") or "")
    if last == 0:  # 10分, 20分: じゅっぷん, にじゅっぷん
        return _JA_TENS_KANA[tens][:-1] + said + span
    return _JA_TENS_KANA[tens] + said + span


_MYRIADS = (("兆", 10**12), ("億", 10**8), ("万", 10**4))
_KANJI_DIGITS = "〇一二三四五六七八九"  # by value: 〇 is never said (no count of 0 is written)
# misaki cuts "0.5" into "0", "." and "5": a pause, and "10.05" lost its 0. Said "れい てん ご" with
# the digits after the point one by one.
_JA_DECIMAL = re.compile(r"(?<![\d.,])(?P<whole>\d+)\.(?P<fraction>\d+)(?![\d.])")
# Money with cents is said in two units, as a price is: "3.50ドル" -> "3ドル50セント", not "3 点 ゴ ゼロ ドル".
_JA_CENTS = re.compile(r"(?<![\d.,])(?P<whole>\d+)\.(?P<cents>\d{2})(?P<unit>ドル|ユーロ|ポンド)")
_JA_CENT_WORD = {"ドル": "セント", "ユーロ": "セント", "ポンド": "ペンス"}
_JA_FRACTION_DIGITS = ("ゼロ", "イチ", "ニ", "サン", "ヨン", "ゴ", "ロク", "ナナ", "ハチ", "キュウ")


def _ja_digits(digits: str) -> str:
    return "".join(_JA_DIGITS[int(c)] for c in digits)


def _ja_kanji(digits: str) -> str:
    """A number of up to 16 digits in kanji, counted in groups of four ("12345" -> "一万二千三百四十五");
    a longer one digit by digit."""
    n = int(digits)
    if n >= 10**16:
        return _ja_digits(digits)

    def below_a_myriad(n: int) -> str:  # 1 before 十, 百 and 千 is not said: 千二百, not 一千二百
        said = ""
        for unit, size in (("千", 1000), ("百", 100), ("十", 10)):
            count, n = divmod(n, size)
            said += "" if not count else unit if count == 1 else _KANJI_DIGITS[count] + unit
        return said + (_KANJI_DIGITS[n] if n else "")
    said = ""
    for unit, size in _MYRIADS:
        count, n = divmod(n, size)
        if count:
            said += below_a_myriad(count) + unit
    return said + below_a_myriad(n)


# Numbers as espeak-ng reads them. Its Spanish, French, Italian and Portuguese read "1.000,50"; a
# number in US form, unambiguous with a comma then a point or with two thousands commas ("$1,000.50",
# "1,234,567"), came out "uno coma cero cero cero cincuenta". French groups thousands with spaces
# ("1 000,50": "un zéro zéro zéro"). Hindi's reads "1000.50" and "1,00,000", but drops the
# decimals after a thousands comma ("1,000.50": "ek hazaar").
_US_NUMBER = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3}\.\d+|(?:,\d{3}){2,}(?:\.\d+)?)(?![\d,]|\.\d)")
_SPACED_THOUSANDS = re.compile(r"(?<![\d.,])\d{1,3}(?: \d{3})+(?![\d.]|,\d{3})")
_HINDI_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{2,3})*,\d{3}(?![\d,])")


def _local_number(m: re.Match) -> str:
    whole, _, fraction = m.group(0).replace(",", "").partition(".")
    return f"{whole},{fraction}" if fraction else whole


# 24-hour clock times; French and Portuguese also write "14h30" and "14h".
_CLOCK = re.compile(r"(?<![\d:])(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)(?![\d:])")
_H_CLOCK = re.compile(r"(?<![\w:])(?P<h>[01]?\d|2[0-3])h(?P<m>[0-5]\d)?(?!\w)")


def _time_words(lang: str, hour: int, minute: int) -> str | None:
    if lang == "e":
        return f"{hour} y {minute}" if minute else f"{hour} en punto"
    if lang == "f":
        hours = "heure" if hour <= 1 else "heures"
        return f"{hour} {hours} {minute}" if minute else f"{hour} {hours}"
    if lang == "i":
        return f"{hour} e {minute}" if minute else f"{hour} in punto"
    if lang == "p":
        return f"{hour} e {minute}" if minute else f"{hour} {'hora' if hour == 1 else 'horas'}"
    if lang == "z":
        return f"{hour}点{minute}分" if minute else f"{hour}点"
    if lang == "j":
        return f"{hour}時{minute}分" if minute else f"{hour}時"
    return None  # Hindi writes "14:30 बजे", which espeak-ng reads as it is


@plain_or_mapped
def normalize(text: MappedText, lang: str) -> MappedText:
    """Signs, dates and clock times of `text` in `lang` (one of LANGUAGES) as words espeak-ng reads."""
    words = _SIGNS[lang]

    space = "" if lang in _YEAR_FIRST else " "  # Mandarin and Japanese put no space before a unit

    def sign(m: re.Match) -> str:
        said = words.get(m.group("sign").replace("US$", "$"))
        if said is None:  # Mandarin's %: cn2an's
            return m.group(0)
        return f"{m.group('n')}{space}{said[0] if m.group('n') == '1' else said[1]}"

    def date(m: re.Match) -> str:
        day, month, year = int(m.group("d")), int(m.group("m")), m.group("y")
        if not (1 <= day <= 31 and 1 <= month <= 12):
            return m.group(0)
        if lang in _YEAR_FIRST:
            return _DATE_FORMAT[lang].format(y=year, m=month, d=day)
        spoken_day = _FIRST_DAY.get(lang, "1") if day == 1 else str(day)
        return _DATE_FORMAT[lang].format(d=spoken_day, month=_MONTHS[lang].split()[month - 1], y=year)

    def clock(m: re.Match) -> str:
        spoken = _time_words(lang, int(m.group("h")), int(m.group("m") or 0))
        return spoken if spoken is not None else m.group(0)

    def without_commas(m: re.Match) -> str:
        digits = m.group(0).replace(",", "")
        return _ja_kanji(digits) if lang == "j" and len(digits) > 9 else digits

    if lang in ("e", "f", "i", "p"):
        text = text.sub(_US_NUMBER, _local_number)
    if lang == "f":
        text = text.sub(_SPACED_THOUSANDS, lambda m: m.group(0).replace(" ", ""))
    if lang == "h":
        text = text.sub(_HINDI_GROUPED, lambda m: m.group(0).replace(",", ""))
    if lang == "j":
        text = text.sub(_JA_PHONE, lambda m: "、".join(_ja_digits(group) for group in m.group(0).split("-")))
    if lang in _YEAR_FIRST:  # "1,500円", "１，５００円": misaki and cn2an read a thousands comma as a pause
        text = text.sub(_FULLWIDTH_SEPARATOR, lambda m: "," if m.group(0) == "，" else ".")
        text = text.sub(_THOUSANDS, without_commas)
    text = text.sub(_YEAR_FIRST_DATE if lang in _YEAR_FIRST else _DATE, date)
    if lang in ("f", "p"):
        text = text.sub(_H_CLOCK, clock)
    text = text.sub(_CLOCK, clock)
    text = text.sub(_SIGN_BEFORE, sign).sub(_SIGN_AFTER, sign)
    if lang == "j":
        text = text.sub(_JA_CENTS, lambda m: m.group("whole") + m.group("unit") + (
            f"{int(m.group('cents'))}{_JA_CENT_WORD[m.group('unit')]}" if int(m.group("cents")) else ""))
        text = text.sub(_JA_DECIMAL, lambda m: m.group("whole") + "点" + "".join(
            _JA_FRACTION_DIGITS[int(c)] for c in m.group("fraction")))
        text = text.sub(_JA_AMOUNT, lambda m: _ja_kanji(m.group(0)))
        text = text.sub(_JA_CODE, lambda m: _ja_digits(m.group(0)))
        text = text.sub(_JA_NUMBER, lambda m: _ja_kanji(m.group(0)))
        text = text.sub(_JA_COUNTED, _ja_counted)
    return text
