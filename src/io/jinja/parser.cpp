#include "io/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "io/jinja/lexer.h"

namespace sluice::jinja {
namespace {

// Nesting deeper than this is surely not a chat template; the limit keeps hostile input from
// exhausting the stack.
constexpr int kMaxNesting = 128;

bool is_one_of(const std::string& s, std::initializer_list<const char*> options) {
  return std::any_of(options.begin(), options.end(), [&](const char* o) { return s == o; });
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({}, "", {});
    expect_type(TokenType::kEnd, "end of template");
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.depth_ > kMaxNesting) {
        throw TemplateError(fmt::format("template nests deeper than {} levels", kMaxNesting),
                            parser.peek().pos);
      }
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kName:
      case TokenType::kOperator:
      case TokenType::kInteger:
      case TokenType::kFloat:
        return fmt::format("'{}'", t.value);
      case TokenType::kString:
        return "string literal";
      default:
        return token_type_name(t.type);
    }
  }
  [[noreturn]] void fail_expected(const std::string& what) const {
    throw TemplateError(fmt::format("expected {}, got {}", what, describe(peek())), peek().pos);
  }

  bool at_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kOperator && peek(ahead).value == op;
  }
  bool at_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kName && peek(ahead).value == name;
  }
  bool accept_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail_expected(fmt::format("'{}'", op));
  }
  const Token& expect_type(TokenType type, const std::string& what) {
    if (peek().type != type) fail_expected(what);
    return next();
  }
  std::string expect_name(const std::string& what) {
    return expect_type(TokenType::kName, what).value;
  }
  void expect_block_end() { expect_type(TokenType::kBlockEnd, "'%}'"); }

  // ---- statements ----

  // Parses statements until a block tag named in `end_tags` (left unconsumed) or the end of input
  // (an error when `end_tags` is non-empty: the block `opener` at `opened` was never closed).
  Body parse_body(std::initializer_list<const char*> end_tags, const std::string& opener,
                  SourcePos opened) {
    DepthGuard guard(*this);
    Body body;
    for (;;) {
      const Token& t = peek();
      if (t.type == TokenType::kEnd) {
        if (end_tags.size() == 0) return body;
        std::string names;
        for (const char* tag : end_tags)
          names += (names.empty() ? "'" : " or '") + std::string(tag) + "'";
        throw TemplateError(fmt::format("expected {} to close '{}' opened at line {}, got end of "
                                        "template",
                                        names, opener, opened.line),
                            t.pos);
      }
      if (t.type == TokenType::kBlockBegin && peek(1).type == TokenType::kName &&
          is_one_of(peek(1).value, end_tags)) {
        return body;
      }
      body.push_back(parse_statement());
    }
  }

  std::unique_ptr<Stmt> make_stmt(Stmt::Kind kind, SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = pos;
    return s;
  }

  std::unique_ptr<Stmt> parse_statement() {
    const Token& t = next();
    if (t.type == TokenType::kText) {
      auto s = make_stmt(Stmt::Kind::kText, t.pos);
      s->text = t.value;
      return s;
    }
    if (t.type == TokenType::kVarBegin) {
      auto s = make_stmt(Stmt::Kind::kOutput, t.pos);
      s->expr = parse_tuple_expression();
      expect_type(TokenType::kVarEnd, "'}}'");
      return s;
    }
    if (t.type != TokenType::kBlockBegin) {
      throw TemplateError(fmt::format("unexpected {}", describe(t)), t.pos);
    }
    SourcePos pos = t.pos;
    std::string tag = expect_name("a tag name after '{%'");
    if (tag == "if") return parse_if(pos);
    if (tag == "for") return parse_for(pos);
    if (tag == "set") return parse_set(pos);
    if (tag == "macro") return parse_macro(pos);
    if (tag == "break" || tag == "continue") {
      expect_block_end();
      return make_stmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, pos);
    }
    if (tag == "generation") {
      expect_block_end();
      auto s = make_stmt(Stmt::Kind::kScope, pos);
      s->bodies.push_back(parse_body({"endgeneration"}, tag, pos));
      next();
      expect_name("'endgeneration'");
      expect_block_end();
      return s;
    }
    if (is_one_of(tag,
                  {"endif", "endfor", "endset", "endmacro", "endgeneration", "elif", "else"})) {
      throw TemplateError(fmt::format("unexpected '{}': no open block to close", tag), pos);
    }
    throw TemplateError(fmt::format("unknown or unsupported tag '{}'", tag), pos);
  }

  std::unique_ptr<Stmt> parse_if(SourcePos pos) {
    auto s = make_stmt(Stmt::Kind::kIf, pos);
    s->conditions.push_back(parse_expression(true));
    expect_block_end();
    for (;;) {
      s->bodies.push_back(parse_body({"elif", "else", "endif"}, "if", pos));
      next();  // '{%'
      std::string tag = next().value;
      if (tag == "elif") {
        s->conditions.push_back(parse_expression(true));
        expect_block_end();
      } else if (tag == "else") {
        expect_block_end();
        s->bodies.push_back(parse_body({"endif"}, "if", pos));
        next();
        next();
        expect_block_end();
        return s;
      } else {
        expect_block_end();
        return s;
      }
    }
  }

  std::vector<std::string> parse_targets(const char* what) {
    std::vector<std::string> targets;
    bool parens = accept_op("(");
    do {
      targets.push_back(expect_name(what));
    } while (accept_op(","));
    if (parens) expect_op(")");
    return targets;
  }

  std::unique_ptr<Stmt> parse_for(SourcePos pos) {
    auto s = make_stmt(Stmt::Kind::kFor, pos);
    s->targets = parse_targets("a loop variable name");
    if (!accept_name("in")) fail_expected("'in'");
    s->expr = parse_expression(false);
    if (accept_name("if")) s->condition = parse_expression(true);
    if (at_name("recursive")) {
      throw TemplateError("recursive loops are not supported", peek().pos);
    }
    expect_block_end();
    s->bodies.push_back(parse_body({"else", "endfor"}, "for", pos));
    next();
    if (next().value == "else") {
      expect_block_end();
      s->bodies.push_back(parse_body({"endfor"}, "for", pos));
      next();
      next();
    }
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_set(SourcePos pos) {
    auto s = make_stmt(Stmt::Kind::kSet, pos);
    s->targets.push_back(expect_name("a variable name after 'set'"));
    if (accept_op(".")) {
      s->text = expect_name("an attribute name after '.'");
    } else {
      while (accept_op(",")) s->targets.push_back(expect_name("a variable name"));
    }
    if (peek().type == TokenType::kBlockEnd && s->targets.size() == 1 && s->text.empty()) {
      next();
      s->kind = Stmt::Kind::kSetBlock;
      s->bodies.push_back(parse_body({"endset"}, "set", pos));
      next();
      next();
      expect_block_end();
      return s;
    }
    expect_op("=");
    s->expr = parse_tuple_expression();
    expect_block_end();
    return s;
  }

  std::unique_ptr<Stmt> parse_macro(SourcePos pos) {
    auto s = make_stmt(Stmt::Kind::kMacro, pos);
    s->text = expect_name("a macro name");
    expect_op("(");
    while (!accept_op(")")) {
      if (!s->targets.empty()) expect_op(",");
      if (accept_op(")")) break;  // trailing comma
      s->targets.push_back(expect_name("a parameter name"));
      s->defaults.push_back(accept_op("=") ? parse_expression(true) : nullptr);
    }
    expect_block_end();
    s->bodies.push_back(parse_body({"endmacro"}, "macro", pos));
    next();
    next();
    if (peek().type == TokenType::kName) next();  // {% endmacro name %}
    expect_block_end();
    return s;
  }

  // ---- expressions ----

  ExprPtr make(Expr::Kind kind, SourcePos pos, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    e->name = std::move(name);
    return e;
  }
  ExprPtr make2(Expr::Kind kind, SourcePos pos, std::string name, ExprPtr a, ExprPtr b) {
    auto e = make(kind, pos, std::move(name));
    e->children.push_back(std::move(a));
    e->children.push_back(std::move(b));
    return e;
  }

  // `a, b` without parentheses, as allowed in {{ }} and set.
  ExprPtr parse_tuple_expression() {
    SourcePos pos = peek().pos;
    ExprPtr first = parse_expression(true);
    if (!at_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, pos);
    tuple->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().type == TokenType::kBlockEnd || peek().type == TokenType::kVarEnd) break;
      tuple->children.push_back(parse_expression(true));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (at_name("if")) {
      SourcePos pos = next().pos;
      auto cond = make(Expr::Kind::kCondExpr, pos);
      cond->children.push_back(parse_or());
      cond->children.push_back(std::move(expr));
      cond->children.push_back(accept_name("else") ? parse_condexpr() : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      SourcePos pos = next().pos;
      left = make2(Expr::Kind::kBinary, pos, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      SourcePos pos = next().pos;
      left = make2(Expr::Kind::kBinary, pos, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      DepthGuard guard(*this);
      SourcePos pos = next().pos;
      auto e = make(Expr::Kind::kUnary, pos, "not");
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    SourcePos pos = peek().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    for (;;) {
      std::string op;
      const Token& t = peek();
      if (t.type == TokenType::kOperator &&
          is_one_of(t.value, {"==", "!=", "<", ">", "<=", ">="})) {
        op = t.value;
        next();
      } else if (at_name("in")) {
        op = "in";
        next();
      } else if (at_name("not") && at_name("in", 1)) {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, pos);
        cmp->children.push_back(std::move(first));
      }
      cmp->kwarg_names.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      left = make2(Expr::Kind::kBinary, t.pos, t.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    SourcePos pos = peek().pos;
    ExprPtr first = parse_math2();
    if (!at_op("~")) return first;
    auto concat = make(Expr::Kind::kConcat, pos);
    concat->children.push_back(std::move(first));
    while (accept_op("~")) concat->children.push_back(parse_math2());
    return concat;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      left = make2(Expr::Kind::kBinary, t.pos, t.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const Token& t = next();
      left = make2(Expr::Kind::kBinary, t.pos, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      node = make(Expr::Kind::kUnary, t.pos, t.value);
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.type) {
      case TokenType::kName: {
        next();
        if (t.value == "true" || t.value == "True") return literal(Value(true), t.pos);
        if (t.value == "false" || t.value == "False") return literal(Value(false), t.pos);
        if (t.value == "none" || t.value == "None") return literal(Value::none(), t.pos);
        return make(Expr::Kind::kName, t.pos, t.value);
      }
      case TokenType::kString: {
        std::string text;
        SourcePos pos = t.pos;
        while (peek().type == TokenType::kString) text += next().value;  // "a" "b" == "ab"
        return literal(Value(std::move(text)), pos);
      }
      case TokenType::kInteger:
        next();
        return literal(Value(t.int_value), t.pos);
      case TokenType::kFloat:
        next();
        return literal(Value(t.float_value), t.pos);
      case TokenType::kOperator:
        if (t.value == "(") return parse_parenthesized();
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail_expected("an expression");
  }

  ExprPtr literal(Value v, SourcePos pos) {
    auto e = make(Expr::Kind::kLiteral, pos);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_parenthesized() {
    SourcePos pos = next().pos;
    if (accept_op(")")) return make(Expr::Kind::kTuple, pos);
    ExprPtr first = parse_expression(true);
    if (!at_op(",")) {
      expect_op(")");
      return first;
    }
    auto tuple = make(Expr::Kind::kTuple, pos);
    tuple->children.push_back(std::move(first));
    while (accept_op(",")) {
      if (at_op(")")) break;
      tuple->children.push_back(parse_expression(true));
    }
    expect_op(")");
    return tuple;
  }

  ExprPtr parse_list() {
    auto list = make(Expr::Kind::kList, next().pos);
    while (!accept_op("]")) {
      if (!list->children.empty()) {
        expect_op(",");
        if (accept_op("]")) break;
      }
      list->children.push_back(parse_expression(true));
    }
    return list;
  }

  ExprPtr parse_dict() {
    auto dict = make(Expr::Kind::kDict, next().pos);
    while (!accept_op("}")) {
      if (!dict->children.empty()) {
        expect_op(",");
        if (accept_op("}")) break;
      }
      dict->children.push_back(parse_expression(true));
      expect_op(":");
      dict->children.push_back(parse_expression(true));
    }
    return dict;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      if (at_op(".")) {
        SourcePos pos = next().pos;
        if (peek().type == TokenType::kInteger) {
          auto index = make(Expr::Kind::kIndex, pos);
          index->children.push_back(std::move(node));
          index->children.push_back(literal(Value(next().int_value), pos));
          node = std::move(index);
        } else {
          auto attr = make(Expr::Kind::kAttr, pos, expect_name("an attribute name after '.'"));
          attr->children.push_back(std::move(node));
          node = std::move(attr);
        }
      } else if (at_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    SourcePos pos = next().pos;
    ExprPtr parts[3];
    bool is_slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!at_op(":") && !at_op("]")) parts[part] = parse_expression(true);
      if (part == 2 || !accept_op(":")) break;
      is_slice = true;
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) fail_expected("an index expression");
      return make2(Expr::Kind::kIndex, pos, "", std::move(node), std::move(parts[0]));
    }
    auto slice = make(Expr::Kind::kSlice, pos);
    slice->children.push_back(std::move(node));
    for (auto& p : parts) slice->children.push_back(std::move(p));
    return slice;
  }

  // Parses "(args)" into `call`, which already holds its callee or filtered value as children[0].
  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!accept_op(")")) {
      if (!first) {
        expect_op(",");
        if (accept_op(")")) break;
      }
      first = false;
      if (at_op("*") || at_op("**")) {
        throw TemplateError("*args and **kwargs in calls are not supported", peek().pos);
      }
      if (peek().type == TokenType::kName && at_op("=", 1)) {
        call.kwarg_names.push_back(next().value);
        next();
      } else if (!call.kwarg_names.empty()) {
        throw TemplateError("positional argument follows keyword argument", peek().pos);
      }
      call.children.push_back(parse_expression(true));
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make(Expr::Kind::kCall, callee->pos);
    call->children.push_back(std::move(callee));
    parse_call_args(*call);
    return call;
  }

  std::string parse_dotted_name(const char* what) {
    std::string name = expect_name(what);
    while (at_op(".") && peek(1).type == TokenType::kName) {
      next();
      name += "." + next().value;
    }
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      if (at_op("|")) {
        SourcePos pos = next().pos;
        auto filter = make(Expr::Kind::kFilter, pos, parse_dotted_name("a filter name after '|'"));
        filter->children.push_back(std::move(node));
        if (at_op("(")) parse_call_args(*filter);
        node = std::move(filter);
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr node) {
    SourcePos pos = next().pos;  // 'is'
    bool negated = accept_name("not");
    auto test = make(Expr::Kind::kTest, pos, parse_dotted_name("a test name after 'is'"));
    test->negated = negated;
    test->children.push_back(std::move(node));
    const Token& t = peek();
    if (at_op("(")) {
      parse_call_args(*test);
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat || at_op("[") ||
                at_op("{")) &&
               !is_one_of(t.type == TokenType::kName ? t.value : "", {"else", "or", "and"})) {
      // Jinja's one-argument form without parentheses: `x is divisibleby 3`.
      if (at_name("is")) throw TemplateError("tests cannot be chained with 'is'", t.pos);
      test->children.push_back(parse_postfix(parse_primary()));
    }
    return test;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source) {
  return Parser(tokenize(source)).parse();
}

}  // namespace sluice::jinja
