// Where a tensor lives. `meta` has real shapes and real allocation accounting
// but no memory behind it and no kernel runs: the budget's dry run uses it.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : unsigned char { CPU, CUDA, Meta };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  static Device meta() { return {DeviceType::Meta, 0}; }

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  bool operator==(const Device&) const = default;

  std::string str() const;
  // "cpu", "cuda", "cuda:1", "meta"
  static Device parse(std::string_view s);
};

}  // namespace kiln
