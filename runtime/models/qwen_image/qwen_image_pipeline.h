#pragma once
// (in progress)
