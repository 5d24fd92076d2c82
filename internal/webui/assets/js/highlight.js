// A small Python syntax highlighter: one regular expression that splits the
// source into tokens, which become <span class="tok-…"> with text content
// (never HTML), so any source is safe to show.

const KEYWORDS = new Set(('False None True and as assert async await break class continue def del elif ' +
  'else except finally for from global if import in is lambda nonlocal not or pass raise return try ' +
  'while with yield match case').split(' '));

const BUILTINS = new Set(('abs all any bin bool bytearray bytes callable chr dict dir divmod enumerate ' +
  'eval exec filter float format frozenset getattr globals hasattr hash help hex id input int isinstance ' +
  'issubclass iter len list locals map max min next object oct open ord pow print property range repr ' +
  'reversed round set setattr slice sorted staticmethod classmethod str sum super tuple type vars zip ' +
  'self cls __name__ __file__ Exception BaseException ValueError TypeError KeyError IndexError ' +
  'AttributeError NameError ZeroDivisionError RuntimeError StopIteration FileNotFoundError OSError ' +
  'ImportError ModuleNotFoundError NotImplementedError AssertionError').split(' '));

// Order matters: comments, then strings (with an optional prefix such as
// f, r, b or rb; triple quotes may run to the end of an unfinished cell),
// decorators, numbers, names, then anything else one character at a time.
const TOKEN = new RegExp([
  /(#[^\n]*)/,
  /((?:[rRbBuUfF]{1,2})?(?:"""[\s\S]*?(?:"""|$(?![\s\S]))|'''[\s\S]*?(?:'''|$(?![\s\S]))|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?))/,
  /(@[A-Za-z_][\w.]*)/,
  /(\b0[xXoObB][\da-fA-F_]+\b|(?:\b\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d+)?[jJ]?)/,
  /([A-Za-z_]\w*)/,
  /(\s+|[^\s\w])/,
].map(r => r.source).join('|'), 'gy');

// tokens splits Python source into [class, text] pairs; class is '' for
// plain text. Concatenating the texts gives back the source exactly.
export function tokens(src) {
  const out = [];
  let prev = '';
  TOKEN.lastIndex = 0;
  let m;
  while (TOKEN.lastIndex < src.length && (m = TOKEN.exec(src))) {
    const [text, comment, string, deco, number, name] = m;
    let cls = '';
    if (comment) cls = 'com';
    else if (string) cls = 'str';
    else if (deco) cls = 'deco';
    else if (number) cls = 'num';
    else if (name) {
      if (prev === 'def' || prev === 'class') cls = 'def';
      else if (KEYWORDS.has(name)) cls = 'kw';
      else if (BUILTINS.has(name)) cls = 'bi';
    }
    out.push([cls, text]);
    if (!/^\s+$/.test(text)) prev = name || text;
  }
  if (TOKEN.lastIndex < src.length) out.push(['', src.slice(TOKEN.lastIndex)]);
  return out;
}

// highlight returns the source as highlighted nodes.
export function highlight(src) {
  const frag = document.createDocumentFragment();
  for (const [cls, text] of tokens(src)) {
    if (!cls) { frag.append(text); continue; }
    const s = document.createElement('span');
    s.className = 'tok-' + cls;
    s.textContent = text;
    frag.append(s);
  }
  return frag;
}

// codeBlock is a read-only block of highlighted Python.
export function codeBlock(src, lang = 'python') {
  const pre = document.createElement('pre');
  pre.className = 'code';
  const code = document.createElement('code');
  code.className = 'lang-' + lang;
  if (lang === 'python') code.append(highlight(src));
  else code.textContent = src;
  pre.append(code);
  return pre;
}
