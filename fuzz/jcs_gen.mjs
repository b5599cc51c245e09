// Random JSON documents and their RFC 8785 canonical form by the reference
// implementation (npm "canonicalize"), for the fingerprint differential
// (fuzz/jcs_diff.py).
//
//   node jcs_gen.mjs SEED START COUNT
//
// writes COUNT rows for COPY ... FROM STDIN (text format), documents
// START .. START+COUNT-1:
//
//   id  expect  doc  canonical  sha256-hex
//
// Document i depends only on (SEED, i), so any document can be regenerated
// alone.  "expect" is "ok" for a document both sides must canonicalise
// identically, else the SQLSTATE the server must raise for it (canonical and
// hash are then \N):
//   22003  a number whose nearest double is infinite, or zero while the
//          number is not (JSON.parse gives Infinity / 0: RFC 8785 has no
//          such number, the extension refuses it), or beyond numeric's range
//   22P02  a lone surrogate escape ("\ud800"): JSON.parse keeps it, jsonb
//          refuses it
//   22P05  "\u0000": JSON.parse keeps it, jsonb refuses it
//
// Both sides read the same document text.  Its meaning is the same to
// JSON.parse and to jsonb plus the extension: duplicate member names keep
// the last value in both; a number is the double nearest to its exact
// decimal value in both (JSON.parse rounds correctly, jsonb keeps the exact
// decimal and the extension rounds it correctly); escapes decode to the same
// characters; whitespace is insignificant.  The documents jsonb cannot hold
// are generated on purpose in small numbers and checked for their error.
import canonicalize from 'canonicalize';
import { createHash } from 'node:crypto';

const [seedArg, startArg, countArg] = process.argv.slice(2);
if (countArg === undefined) {
    process.stderr.write('usage: node jcs_gen.mjs SEED START COUNT\n');
    process.exit(2);
}
const SEED = Number(seedArg) >>> 0;
const START = Number(startArg);
const COUNT = Number(countArg);

// ---------------------------------------------------------------- PRNG (sfc32)
let a = 0, b = 0, c = 0, d = 0;
function rnd() {
    a >>>= 0; b >>>= 0; c >>>= 0; d >>>= 0;
    let t = (a + b) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    d = (d + 1) | 0;
    t = (t + d) | 0;
    c = (c + t) | 0;
    return (t >>> 0) / 4294967296;
}
function seedDoc(i) {
    // splitmix32 of (seed, index)
    let s = (SEED ^ Math.imul(i + 1, 0x9e3779b9)) >>> 0;
    const next = () => {
        s = (s + 0x9e3779b9) >>> 0;
        let z = s;
        z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
        z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
        return (z ^ (z >>> 16)) >>> 0;
    };
    a = next(); b = next(); c = next(); d = next() ^ (i / 4294967296 >>> 0);
    for (let k = 0; k < 12; k++) rnd();
}
const int = (n) => Math.floor(rnd() * n);           // 0 .. n-1
const range = (lo, hi) => lo + int(hi - lo + 1);     // lo .. hi
const pick = (arr) => arr[int(arr.length)];
const chance = (p) => rnd() < p;

// ---------------------------------------------------------------- state per document
// jsonb's input function stops at the first problem it meets in the text
// (castError); the extension's 22003 comes after the cast (numberError)
let castError, numberError;
function expectCastError(state) {
    if (castError === null) castError = state;
}

// ---------------------------------------------------------------- strings
// code points, by class; surrogates (D800-DFFF) never appear raw
function codePoint() {
    const r = rnd();
    if (r < 0.40) return 97 + int(26);                  // a-z
    if (r < 0.52) return 32 + int(95);                  // printable ASCII incl. " \ /
    if (r < 0.58) return 1 + int(31);                   // controls (escaped)
    if (r < 0.60) return 0x7f;
    if (r < 0.66) return 0x80 + int(0x780);             // Latin, Greek, Cyrillic..
    if (r < 0.68) return pick([0x2028, 0x2029, 0x0301, 0x00e9, 0x200b, 0xfeff]);
    if (r < 0.74) return 0x4e00 + int(0x5000);          // CJK
    if (r < 0.82) return 0xe000 + int(0x2000);          // private use .. FFFF: sorts after astral in UTF-16
    if (r < 0.86) return 0xfff0 + int(16);              // FFF0..FFFF, incl. FFFE, FFFF
    if (r < 0.94) return 0x1f300 + int(0x700);          // emoji
    return 0x10000 + int(0x100000);                     // any astral plane
}
const hex4 = (n) => {
    const h = n.toString(16).padStart(4, '0');
    return chance(0.5) ? h.toUpperCase() : h;
};
const SHORT = { 8: '\\b', 9: '\\t', 10: '\\n', 12: '\\f', 13: '\\r' };

// JSON text of a string made of the code points cps; escapes chosen at random
function writeString(cps) {
    let out = '"';
    for (const cp of cps) {
        if (cp === 0x22) out += '\\"';
        else if (cp === 0x5c) out += '\\\\';
        else if (cp < 0x20) out += (SHORT[cp] && chance(0.6)) ? SHORT[cp] : '\\u' + hex4(cp);
        else if (cp === 0x2f && chance(0.3)) out += '\\/';
        else if (chance(0.12)) {
            if (cp >= 0x10000) {
                const v = cp - 0x10000;
                out += '\\u' + hex4(0xd800 + (v >> 10)) + '\\u' + hex4(0xdc00 + (v & 0x3ff));
            } else {
                out += '\\u' + hex4(cp);
            }
        } else out += String.fromCodePoint(cp);
    }
    return out + '"';
}

function randomString(maxlen) {
    const n = int(maxlen + 1);
    const cps = new Array(n);
    for (let i = 0; i < n; i++) cps[i] = codePoint();
    return cps;
}

function stringValue() {
    const r = rnd();
    let cps;
    if (flavour === 'long' && chance(0.2)) cps = randomString(range(1000, 60000));
    else if (r < 0.05) cps = [];
    else cps = randomString(chance(0.9) ? 12 : 60);
    let text = writeString(cps);
    if (chance(0.0015)) {
        // a lone surrogate escape: JSON.parse accepts it, jsonb does not
        const lone = chance(0.5) ? 0xd800 + int(0x400) : 0xdc00 + int(0x400);
        text = text.slice(0, -1) + '\\u' + hex4(lone) + (chance(0.5) ? 'x' : '') + '"';
        expectCastError('22P02');
    } else if (chance(0.0008)) {
        text = text.slice(0, -1) + '\\u0000"';
        expectCastError('22P05');
    }
    return text;
}

// member names: short, and often near each other so that sorting matters
const NAMES = ['', 'a', 'A', 'aa', 'b', '__proto__', 'constructor',
               'toJSON', 'hasOwnProperty', 'length', '0', '1', '10', '9', '-1', 'é', 'e\u0301',
               '\u20ac', '\ue000', '\uffff', '\ud83d\ude00', '\u{10ffff}', '\u{10000}', ' ', '\u007f',
               '\t', '\n', '"', '\\', '/'];
function memberName(siblings) {
    const r = rnd();
    if (r < 0.25) return [...pick(NAMES)].map((ch) => ch.codePointAt(0));
    if (r < 0.40 && siblings.length > 0) {
        // a sibling's name with a character changed or appended
        const base = pick(siblings).slice();
        if (base.length > 0 && chance(0.5)) base[int(base.length)] = codePoint();
        else base.push(codePoint());
        return base;
    }
    if (r < 0.45 && siblings.length > 0) return pick(siblings).slice();   // duplicate: last wins
    return randomString(chance(0.9) ? 6 : 40);
}

// ---------------------------------------------------------------- numbers
const SPECIAL_NUMBERS = [
    '0', '-0', '0.0', '-0.0', '0e0', '-0E-5', '0.000', '1', '-1', '1.0', '1.000', '100', '1e2', '-1E+2',
    '1e21', '1e20', '999999999999999999999', '100000000000000000000', '1e-7', '1e-6', '0.000001',
    '0.0000001', '123e-20', '4.50', '1E30', '0.1', '0.2', '0.30000000000000004', '1.0000000000000002',
    '9007199254740991', '9007199254740992', '9007199254740993', '18014398509481985',
    '123456789012345678901234567890', '5e-324', '-5e-324', '4.9406564584124654e-324',
    '2.4703282292062328e-324', '2.4703282292062327e-324', '2.225073858507201e-308',
    '2.2250738585072011e-308', '2.2250738585072014e-308', '2.2250738585072012e-308',
    '1.7976931348623157e308', '-1.7976931348623157e308', '1.7976931348623158e308',
    '1.7976931348623158079e308', '1.797693134862315807937e308', '1.7976931348623159e308',
    '1e308', '1e309', '-1e309', '1e-323', '1e-324', '3e-324', '1e400', '-1e400', '1e-400',
    '8.41e21', '1.2345678901234567e-310', '1.23456789012345e-320', '9.999999999999999e22',
    '1e23', '8.988465674311579e307', '0.1e1', '0.01e2', '10e-1', '0e0',
    '295147905179352825856', '1.5e300', '4.35e-310', '1e-5', '-1e-7', '1e+21', '1e+20',
];

// the exact decimal value of m * 2^e (m a BigInt), as JSON number text
function exactDecimal(m, e) {
    if (e >= 0) return (m << BigInt(e)).toString();
    const k = -e;
    let digits = (m * 5n ** BigInt(k)).toString();
    if (digits.length <= k) digits = '0'.repeat(k - digits.length + 1) + digits;
    const ip = digits.slice(0, digits.length - k);
    const fp = digits.slice(digits.length - k).replace(/0+$/, '');
    return fp ? ip + '.' + fp : ip;
}

// a random finite positive double's (mantissa, exponent): value = m * 2^e
function randomDouble() {
    const r = rnd();
    let bexp;
    if (r < 0.15) bexp = 0;                        // subnormal
    else if (r < 0.25) bexp = 2046;                // largest binade
    else if (r < 0.35) bexp = 1 + int(40);         // just above subnormal
    else bexp = 1 + int(2046);
    const hi = BigInt(int(1 << 20)), lo = BigInt(int(2 ** 32));
    let frac = (hi << 32n) | lo;
    if (chance(0.1)) frac = chance(0.5) ? 0n : (1n << 52n) - 1n;
    if (bexp === 0) return [frac === 0n ? 1n : frac, -1074];
    return [(1n << 52n) | frac, bexp - 1075];
}

// numbers on the rounding edge: the exact midpoint between two adjacent
// doubles (ties to even), or just below / above it, or a double's exact value
// (possibly with hundreds of digits), or truncated to 17-25 digits
function hardNumber() {
    const [m, e] = randomDouble();
    const r = rnd();
    let text;
    if (r < 0.35) text = exactDecimal(2n * m + 1n, e - 1);           // midpoint above m
    else if (r < 0.45) text = exactDecimal(2n * m - 1n, e - 1);      // midpoint below m
    else text = exactDecimal(m, e);                                  // exactly a double
    if (r >= 0.35 && r < 0.45 && m === 1n && e === -1074) text = exactDecimal(1n, -1075);
    const r2 = rnd();
    if (r2 < 0.25 && text.includes('.')) text += '0'.repeat(int(3)) + String(1 + int(9));   // nudged up
    else if (r2 < 0.45) {
        // significant digits cut to 17..25, written with an exponent
        let digits = text.replace('.', '');
        const point = text.includes('.') ? text.indexOf('.') : text.length;
        const lead = digits.match(/^0*/)[0].length;
        digits = digits.slice(lead);
        const keep = range(16, 25);
        const exp = point - lead - 1;
        text = digits[0] + '.' + (digits.slice(1, keep) || '0') + 'e' + exp;
    }
    return text;
}

function digitsString(n) {
    let s = String(1 + int(9));
    for (let i = 1; i < n; i++) s += String(int(10));
    return s;
}

function numberText() {
    const r = rnd();
    const sign = chance(0.3) ? '-' : '';
    let t;
    if (r < 0.20) t = String(int(100000));
    else if (r < 0.28) t = digitsString(range(1, 30));
    else if (r < 0.40) t = String(int(100000)) + '.' + digitsString(range(1, 8)) + '0'.repeat(int(3));
    else if (r < 0.52) {
        const mant = chance(0.5) ? digitsString(range(1, 18))
                                 : String(int(10)) + '.' + digitsString(range(1, 20));
        const er = rnd();
        let ex;
        if (er < 0.6) ex = range(-30, 30);
        else if (er < 0.97) ex = range(-330, 315);
        else if (er < 0.995) ex = range(-5000, 5000);
        else ex = pick([200000, -20000, -200000, 2000000000]);          // beyond numeric
        const es = ex < 0 ? '-' : (chance(0.3) ? '+' : '');
        const zeros = chance(0.1) ? '0'.repeat(range(1, 3)) : '';
        t = mant + (chance(0.5) ? 'e' : 'E') + es + zeros + String(Math.abs(ex));
    } else if (r < 0.60) t = '0.' + '0'.repeat(int(12)) + digitsString(range(1, 6));
    else if (r < 0.72) t = pick(SPECIAL_NUMBERS);
    else if (r < 0.90) t = hardNumber();
    else t = String(rnd() * 10 ** range(-20, 25));
    if (t.startsWith('-')) t = t.slice(1);
    const text = sign + t;
    classifyNumber(text);
    return text;
}

// what the server must answer for a number (JSON.parse's double tells)
function classifyNumber(text) {
    const v = Number(text);
    const m = text.match(/[eE]([-+]?\d+)$/);
    const e10 = m ? Number(m[1]) : 0;
    // numeric holds 131072 digits before the point and 16383 after: the
    // generator never comes near those limits, only far beyond them
    if (e10 > 100000 || e10 < -16000) expectCastError('22003');
    else if (!Number.isFinite(v)) numberError = '22003';
    else if (v === 0 && /[1-9]/.test(text.replace(/[eE].*$/, ''))) numberError = '22003';
}

// ---------------------------------------------------------------- documents
function ws() {
    if (!chance(0.08)) return '';
    let s = '';
    const n = range(1, 3);
    for (let i = 0; i < n; i++) s += pick([' ', '\t', '\n', '\r', '  ']);
    return s;
}

function value(depth) {
    const r = rnd();
    if (depth > 0 && r < 0.30) return object(depth - 1);
    if (depth > 0 && r < 0.45) return array(depth - 1);
    if (r < 0.70) return numberText();
    if (r < 0.93) return stringValue();
    return pick(['true', 'false', 'null']);
}

function object(depth) {
    const wide = flavour === 'wide' && chance(0.3);
    const n = wide ? range(100, 1000) : int(7);
    const names = [];
    const parts = [];
    const errors = [];
    const outer = numberError;
    for (let i = 0; i < n; i++) {
        const name = memberName(names);
        names.push(name);
        numberError = null;
        parts.push(ws() + writeString(name) + ws() + ':' + ws() + value(wide ? 0 : depth) + ws());
        errors.push(numberError);
    }
    // a duplicate name drops the earlier value, and a bad number with it
    const last = new Map();
    names.forEach((name, i) => last.set(String.fromCodePoint(...name), i));
    numberError = outer;
    for (const i of last.values()) if (errors[i]) numberError = errors[i];
    return '{' + (n ? parts.join(',') : ws()) + '}';
}

function array(depth) {
    const n = (flavour === 'wide' && chance(0.3)) ? range(100, 1500) : int(6);
    const parts = [];
    for (let i = 0; i < n; i++) parts.push(ws() + value(n > 20 ? 0 : depth) + ws());
    return '[' + (n ? parts.join(',') : ws()) + ']';
}

// a deep chain of arrays and objects around a small document
function deep() {
    const levels = range(50, 1000);
    let open = '', close = '';
    for (let i = 0; i < levels; i++) {
        if (chance(0.5)) { open += '['; close = ']' + close; }
        else {
            const name = writeString(randomString(3));
            if (chance(0.3)) { open += '{' + name + ':1,' + name + ':'; }   // duplicate name, last wins
            else open += '{' + name + ':';
            close = '}' + close;
        }
    }
    return open + value(2) + close;
}

// most documents are ordinary requests; a few are wide (objects with up to
// 1,000 members, arrays of up to 1,500 elements), deep (50 to 1,000
// levels) or hold long strings (up to 60,000 characters)
let flavour;
function documentText() {
    const f = rnd();
    flavour = f < 0.01 ? 'wide' : f < 0.02 ? 'deep' : f < 0.025 ? 'long' : 'plain';
    if (flavour === 'deep') return deep();
    const r = rnd();
    if (r < 0.55) return object(range(1, 4));
    if (r < 0.75) return array(range(1, 3));
    return value(2);
}

// ---------------------------------------------------------------- output
const copyEscape = (s) => s.replace(/[\\\t\n\r]/g,
    (ch) => ({ '\\': '\\\\', '\t': '\\t', '\n': '\\n', '\r': '\\r' })[ch]);

const chunks = [];
let size = 0;
function emit(line) {
    chunks.push(line);
    size += line.length;
    if (size > 1 << 20) flush();
}
function flush() {
    if (chunks.length) process.stdout.write(chunks.join(''));
    chunks.length = 0;
    size = 0;
}

for (let i = START; i < START + COUNT; i++) {
    seedDoc(i);
    castError = null;
    numberError = null;
    const doc = ws() + documentText() + ws();
    const expect = castError || numberError || 'ok';
    if (expect === 'ok') {
        const canon = canonicalize(JSON.parse(doc));
        const hash = createHash('sha256').update(canon, 'utf8').digest('hex');
        emit(`${i}\tok\t${copyEscape(doc)}\t${copyEscape(canon)}\t${hash}\n`);
    } else {
        emit(`${i}\t${expect}\t${copyEscape(doc)}\t\\N\t\\N\n`);
    }
}
flush();
