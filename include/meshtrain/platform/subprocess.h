// Running this project's helper programs: the path of the running binary, and
// a child's standard output (no shell). The tokenizer lives in its own
// program (meshtrain-tokenize: SentencePiece and libtorch cannot share a
// process), so the trainer and the CLI reach it through these.
#pragma once

#include <string>
#include <vector>

namespace meshtrain {

// This program's path (/proc/self/exe).
std::string self_exe();

// `name` in the running binary's directory (meshtrain-tokenize beside meshtrain).
std::string helper_path(const std::string& name);

// Runs args[0] with args and returns its standard output. When it fails,
// throws std::runtime_error with its standard error (its own message: a bad
// file and line, say).
std::string capture_output(const std::vector<std::string>& args);

// A command line split into words as a shell splits it, expanding nothing: whitespace
// separates, '...' and "..." quote (\" and \\ inside double quotes), \ escapes one
// character. std::invalid_argument naming `what` (the setting it came from) for an
// unterminated quote, a trailing backslash or no word at all.
std::vector<std::string> command_words(const std::string& command, const std::string& what);

}  // namespace meshtrain
