// The validation set: the same units on every mesh.
//
// It is the first `count` units (windows; DPO pairs; SFT's packed rows) of
// the validation data's epoch-0 order (data/loader.h: shuffled from the seed,
// one list, whatever the mesh), 0 = all of them. Call k hands data rank r the
// units [(k x D + r) x micro, +micro) of that list (D data ranks), so the
// ranks together cover each unit exactly once; a rank whose range runs past
// the end gets rows that train nothing (targets -1; a padded DPO pair has no
// target in either row and counts as no pair), and every rank makes the same
// number of calls (the model's collectives over tp, cp, pp and ZeRO-3 need
// them all). Summing the objective's sums over the data ranks then gives one
// number for every mesh (up to the order of the fp32 sums), and over all
// windows it is `meshtrain eval --data`'s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/data/loader.h"

namespace meshtrain {

class ValidationSet {
 public:
  // Throws std::invalid_argument (naming the numbers) when the data holds no
  // unit of `seq`, or fewer than `count`.
  ValidationSet(const std::vector<std::string>& shards, int64_t seq, int64_t micro_batch, uint64_t seed,
                LoaderOptions o, uint64_t count, int data_rank, int data_size);

  uint64_t units() const { return units_; }
  // Calls every rank makes: ceil(units / (micro_batch x data ranks)).
  uint64_t calls() const;
  // This rank's micro_batch units of call `k`, padded past the end.
  Batch batch(uint64_t k);

 private:
  TokenLoader order_;  // one rank, one unit per step: the global order
  int64_t micro_batch_, seq_, rows_per_unit_;
  uint64_t units_;
  int data_rank_, data_size_;
  bool documents_;
};

}  // namespace meshtrain
