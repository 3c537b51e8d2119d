// One exception hierarchy for everything sparsejit refuses or fails at.
#pragma once

#include <stdexcept>
#include <string>

namespace sjit {

// Base of every sparsejit exception: catch this to catch them all.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something the operation cannot take (null pointer, bad size, misaligned buffer...).
// The message names the argument, its value, and what is allowed.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A spec's key text could not be parsed, or a spec field holds a value the op does not support.
class InvalidSpec : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// NVRTC refused the generated unit. Carries the compiler's full log and the generated source.
class CompileError : public Error {
 public:
  CompileError(const std::string& what, std::string log, std::string source)
      : Error(what), log_(std::move(log)), source_(std::move(source)) {}
  const std::string& log() const { return log_; }
  const std::string& source() const { return source_; }

 private:
  std::string log_;
  std::string source_;
};

// A CUDA driver call failed. Carries the call and the CUresult's name (e.g. CUDA_ERROR_OUT_OF_MEMORY).
class DriverError : public Error {
 public:
  DriverError(const std::string& what, int code, std::string code_name)
      : Error(what), code_(code), code_name_(std::move(code_name)) {}
  int code() const { return code_; }
  const std::string& code_name() const { return code_name_; }

 private:
  int code_;
  std::string code_name_;
};

// No usable GPU or driver on this machine: everything but launching still works.
class NoDevice : public Error {
 public:
  using Error::Error;
};

}  // namespace sjit
