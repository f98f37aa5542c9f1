// CLI11 tables shared by the subcommands: set-up, value checks, shared flags, one-line errors, completion's lists.
#include "train/cli.h"

#include <algorithm>
#include <cmath>

namespace castor::train {

std::unique_ptr<CLI::App> make_app(const std::string& description, const std::string& name) {
  auto app = std::make_unique<CLI::App>(description, name);
  app->option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->get_formatter()->column_width(34);
  return app;
}

namespace {

// Edits (insertions, deletions, substitutions) between a and b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// "unknown flag --eval_iters; did you mean --eval-iters?" for the first argument that no option of `app` takes
// (the nearest long flag suggested when it is a few edits away), or "unexpected argument 'x'".
std::string unknown_argument(const CLI::App& app, const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (!a.starts_with("-")) continue;
    const std::string flag = a.substr(0, a.find('='));
    if (app.get_option_no_throw(flag) != nullptr || flag == "--help" || flag == "-h") continue;
    std::string best;
    size_t best_distance = std::max<size_t>(2, flag.size() / 3) + 1;
    for (const CLI::Option* o : app.get_options())
      for (const std::string& name : o->get_lnames())
        if (const size_t d = edit_distance(flag, "--" + name); d < best_distance) best = "--" + name, best_distance = d;
    return "unknown flag " + flag + (best.empty() ? std::string() : "; did you mean " + best + "?");
  }
  return "unexpected argument";
}

}  // namespace

void parse_flags(CLI::App& app, std::vector<std::string> args, const std::string& command) {
  const std::vector<std::string> given = args;
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last-first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      const std::string what = msg;
      msg = unknown_argument(app, given);
      if (msg == "unexpected argument") msg += " '" + what.substr(what.find(": ") + 2) + "'";
      msg += " (see castor " + command + " --help)";
    } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
      msg = msg.substr(0, msg.find(':')) + ": missing value";
    } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
      // CLI11: "Could not convert: --flag = value"
      const size_t at = msg.find("--"), eq = msg.find(" = ");
      if (at != std::string::npos && eq != std::string::npos)
        msg = msg.substr(at, eq - at) + ": invalid value '" + msg.substr(eq + 3) + "' (see castor " + command +
              " --help)";
    }
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    throw Error(msg);
  }
}

std::string flag_words(const CLI::App& app) {
  std::string w;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& name : o->get_lnames()) w += (w.empty() ? "--" : " --") + name;
  return w;
}

namespace {

double parse_number(const std::string& v, std::string& err) {
  size_t used = 0;
  double d = 0;
  try {
    d = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty())
    err = "expected a number, got '" + v + "'";
  else if (!std::isfinite(d))
    err = "must be finite, got " + v;
  return d;
}

}  // namespace

CLI::Validator number_in(double lo, double hi, bool lo_open, bool hi_open, const std::string& range) {
  return CLI::Validator(
      [=](std::string& v) {
        std::string err;
        const double d = parse_number(v, err);
        if (err.empty() && ((lo_open ? d <= lo : d < lo) || (hi_open ? d >= hi : d > hi)))
          err = "must be " + range + ", got " + v;
        return err;
      },
      "");
}

const CLI::Validator& positive() {
  static const CLI::Validator v = number_in(0, HUGE_VAL, true, false, "positive");
  return v;
}
const CLI::Validator& non_negative() {
  static const CLI::Validator v = number_in(0, HUGE_VAL, false, false, "non-negative");
  return v;
}
const CLI::Validator& unit_interval() {
  static const CLI::Validator v = number_in(0, 1, false, true, "in [0, 1)");
  return v;
}

CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [=](std::string& v) {
        std::string err;
        const double d = parse_number(v, err);
        if (!err.empty()) return err;
        if (d != std::floor(d) || std::fabs(d) > 9007199254740992.0) return "expected an integer, got '" + v + "'";
        if (d < static_cast<double>(min)) return "must be at least " + std::to_string(min) + ", got " + v;
        if (d > static_cast<double>(max)) return "must be at most " + std::to_string(max) + ", got " + v;
        return std::string();
      },
      "");
}

CLI::Validator one_of(std::vector<std::string> choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : "|") + c;
  return CLI::Validator(
      [=](std::string& v) {
        for (const std::string& c : choices)
          if (v == c) return std::string();
        return "expected " + list + ", got '" + v + "'";
      },
      list);
}

CLI::Option* add_threads(CLI::App& app, int& target, const std::string& help) {
  return app.add_option("--threads", target, help)->check(integer_in(0, kMaxThreads));
}
CLI::Option* add_seed(CLI::App& app, uint64_t& target, const std::string& help) {
  return app.add_option("--seed", target, help)->check(integer_in(0));
}
CLI::Option* add_init(CLI::App& app, std::string& target, const std::string& help) {
  return app.add_option("--init", target, help);
}
CLI::Option* add_lora_base(CLI::App& app, std::string& target, const std::string& help) {
  return app.add_option("--lora-base", target, help);
}
CLI::Option* add_chat_template(CLI::App& app, std::string& target) {
  return app.add_option("--chat-template", target,
                        "a Jinja chat template file to use in place of the model's (its chat_template.jinja or "
                        "tokenizer_config.json's chat_template; a token directory's recorded one; Castor's ChatML): "
                        "with tokenize --format chat and sample --chat");
}
CLI::Option* add_lora(CLI::App& app, std::string& target, const std::string& help) {
  return app.add_option("--lora", target, help);
}
CLI::Option* add_dtype(CLI::App& app, std::optional<DType>& target, const std::string& help) {
  return app
      .add_option_function<std::string>(
          "--dtype", [&target](const std::string& v) { target = parse_dtype(v); }, help)
      ->check(one_of({"float32", "bf16", "bfloat16", "fp16", "float16"}));
}
CLI::Option* add_n_head(CLI::App& app, int64_t& target, const std::string& help) {
  return app.add_option("--n-head", target, help)->check(integer_in(0, 1024));
}

}  // namespace castor::train
